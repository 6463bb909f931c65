package dispatch

import (
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
)

// A reload: a request resolves in the configuration it was authenticated under (its
// principal's), so one request never mixes two; a principal without one resolves in the
// gateway's current configuration, which SetConfig replaces. A plan resolved before keeps its
// profile.
func TestResolveUsesThePrincipalsConfigAndSetConfigForTheRest(t *testing.T) {
	d := testDispatcher(t)
	all := auth.Principal{Name: "c", Routes: []string{"*"}}
	before, err := d.Resolve(all, "llama3.2")
	if err != nil || before.Profile.Name != "fast" || time.Duration(before.Profile.Deadline) != time.Minute {
		t.Fatalf("before: %+v, %v", before.Profile, err)
	}

	next, err := edgeconfig.Parse([]byte(`
listen: {http: "127.0.0.1:8080", quic: "127.0.0.1:7443"}
identity: {mode: loopback}
profiles: [{name: slow, deadline: 1h}]
routes: [{name: llama, model: llama3.2, profile: slow}]
`))
	if err != nil {
		t.Fatal(err)
	}
	withNext := all
	withNext.Config = next
	if plan, err := d.Resolve(withNext, "llama3.2"); err != nil || plan.Profile.Name != "slow" {
		t.Errorf("a principal authenticated under the new config: %+v, %v; want profile slow", plan.Profile, err)
	}
	if plan, _ := d.Resolve(all, "llama3.2"); plan.Profile.Name != "fast" {
		t.Errorf("a principal without a config before SetConfig: profile %q, want fast", plan.Profile.Name)
	}
	d.SetConfig(next)
	if plan, _ := d.Resolve(all, "llama3.2"); plan.Profile.Name != "slow" {
		t.Errorf("after SetConfig: profile %q, want slow", plan.Profile.Name)
	}
	if before.Profile.Name != "fast" || time.Duration(before.Profile.Deadline) != time.Minute {
		t.Errorf("the plan resolved before the reload changed: %+v", before.Profile)
	}
}
