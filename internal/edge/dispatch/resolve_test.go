package dispatch

import (
	"errors"
	"testing"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/sched"
)

func testDispatcher(t *testing.T) *Dispatcher {
	t.Helper()
	cfg, err := edgeconfig.Parse([]byte(`
listen: {http: "127.0.0.1:8080", quic: "127.0.0.1:7443"}
identity: {mode: loopback}
profiles: [{name: fast, deadline: 1m}]
routes:
  - {name: llama, model: llama3.2, profile: fast, targets: [{target: "llama3.2:latest", adapter: ollama, nodes: [gpu-1]}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	return New(cfg, nil, nil, Options{})
}

// A principal may use only its routes; a model without a route needs "*".
func TestResolveChecksThePrincipalsRoutes(t *testing.T) {
	d := testDispatcher(t)
	for _, c := range []struct {
		name      string
		p         auth.Principal
		model     string
		forbidden bool
		route     string
	}{
		{"own route", auth.Principal{Name: "a", Routes: []string{"llama"}}, "llama3.2", false, "llama"},
		{"other route", auth.Principal{Name: "b", Routes: []string{"other"}}, "llama3.2", true, ""},
		{"unrouted model, named routes only", auth.Principal{Name: "a", Routes: []string{"llama"}}, "qwen3", true, ""},
		{"unrouted model, every route", auth.Principal{Name: "c", Routes: []string{"*"}}, "qwen3", false, ""},
	} {
		plan, err := d.Resolve(c.p, c.model)
		if got := errors.Is(err, ErrForbidden); got != c.forbidden {
			t.Errorf("%s: err %v, forbidden want %v", c.name, err, c.forbidden)
			continue
		}
		if err == nil && plan.Route != c.route {
			t.Errorf("%s: route %q, want %q", c.name, plan.Route, c.route)
		}
	}
}

// A route's targets filter candidates by target, adapter and Node; a model
// without a route matches its own name and Ollama's implicit ":latest".
func TestPlanMatchesOnlyTheRoutesTargets(t *testing.T) {
	d := testDispatcher(t)
	all := auth.Principal{Name: "c", Routes: []string{"*"}}
	plan, err := d.Resolve(all, "llama3.2")
	if err != nil {
		t.Fatal(err)
	}
	if d := plan.Profile.Deadline; d.String() != "1m0s" {
		t.Errorf("profile deadline %v, want the route's profile (1m)", d)
	}
	for _, c := range []struct {
		c    sched.Candidate
		want bool
	}{
		{sched.Candidate{NodeID: "gpu-1", Adapter: "ollama", Target: "llama3.2:latest"}, true},
		{sched.Candidate{NodeID: "gpu-2", Adapter: "ollama", Target: "llama3.2:latest"}, false},
		{sched.Candidate{NodeID: "gpu-1", Adapter: "openai", Target: "llama3.2:latest"}, false},
		{sched.Candidate{NodeID: "gpu-1", Adapter: "ollama", Target: "llama3.2:1b"}, false},
	} {
		if got := plan.Match(c.c); got != c.want {
			t.Errorf("route match %+v = %v, want %v", c.c, got, c.want)
		}
	}
	plan, err = d.Resolve(all, "qwen3")
	if err != nil {
		t.Fatal(err)
	}
	plan = *plan.WithAdapter("ollama")
	for _, c := range []struct {
		c    sched.Candidate
		want bool
	}{
		{sched.Candidate{Adapter: "ollama", Target: "qwen3"}, true},
		{sched.Candidate{Adapter: "ollama", Target: "qwen3:latest"}, true},
		{sched.Candidate{Adapter: "ollama", Target: "qwen3:8b"}, false},
		{sched.Candidate{Adapter: "openai", Target: "qwen3"}, false},
	} {
		if got := plan.Match(c.c); got != c.want {
			t.Errorf("unrouted match %+v = %v, want %v", c.c, got, c.want)
		}
	}
}
