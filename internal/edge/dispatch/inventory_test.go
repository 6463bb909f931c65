package dispatch

import (
	"errors"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// A plan holds the route's profile; a route the principal may not use is
// ErrForbidden; the inventory lists only the routes it may use that a Node
// serves now (P1).
func TestThePlanHasTheRoutesProfileAndTheInventoryOnlyWhatCanBeServed(t *testing.T) {
	cfg := edgeconfig.Default()
	slow := edgeconfig.DefaultProfile()
	slow.Name, slow.IdleTimeout = "slow", yamlconf.Duration(7*time.Minute)
	cfg.Profiles = []edgeconfig.Profile{slow}
	cfg.Routes = []edgeconfig.Route{{Name: "llama", Model: "llama3.2", Profile: "slow"}, {Name: "qwen", Model: "qwen3", Profile: "default"}}
	reg := fleet.New(fleet.Options{})
	d := New(cfg, SchedulerSlots(sched.New(reg, sched.Options{})), ServerNodes(nodeserver.NewServer(nodeserver.Options{}, reg)), Options{})
	bob := auth.Principal{Name: "bob", Routes: []string{"llama"}}

	plan, err := d.Resolve(bob, "llama3.2")
	if err != nil || time.Duration(plan.Profile.IdleTimeout) != 7*time.Minute || plan.Principal.Name != "bob" {
		t.Errorf("plan %+v, %v", plan, err)
	}
	if _, err := d.Resolve(bob, "qwen3"); !errors.Is(err, ErrForbidden) {
		t.Errorf("another principal's route: %v", err)
	}
	if inv := d.Inventory(bob); len(inv) != 0 {
		t.Errorf("inventory %+v, want nothing: no Node serves llama3.2", inv)
	}
	if err := d.Available(plan); !errors.Is(err, sched.ErrNoCandidate) {
		t.Errorf("a routed model no Node serves: %v, want no_candidate", err)
	}
	providers := []*wirepb.Provider{{Name: "p", Adapter: "ollama", Capacity: 1, State: wirepb.ProviderState_PROVIDER_STATE_ONLINE,
		Targets: []*wirepb.Target{{Name: "llama3.2"}, {Name: "qwen3"}}}}
	c := reg.Register(fleet.ConnInfo{NodeID: "n1", Providers: providers})
	if err := reg.MarkReady(c, c.Generation(), providers); err != nil {
		t.Fatal(err)
	}
	if inv := d.Inventory(bob); len(inv) != 1 || inv[0].ID != "llama3.2" || !inv[0].Has("ollama") {
		t.Errorf("inventory %+v, want llama3.2 only (bob's route)", inv)
	}
	if err := d.Available(plan); err != nil {
		t.Errorf("available: %v", err)
	}
	if cs := d.Candidates(*plan.WithAdapter("openai")); len(cs) != 0 {
		t.Errorf("candidates of another adapter: %v", cs)
	}
}
