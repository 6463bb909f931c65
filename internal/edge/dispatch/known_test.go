package dispatch

import (
	"errors"
	"testing"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// SPEC P1, issue 11: a model that no route names and no Node offers is
// unknown (404 in every API); one that a route names, or that a Node still
// in the registry offers (even a fenced one), is known and 503 when nobody
// can serve it now.
func TestAModelNobodyOffersIsUnknownOneThatIsGoneIsUnavailable(t *testing.T) {
	d, reg := overRegistry(t, "routes: [{name: r, model: routed}]\n")
	all := auth.Principal{Name: "a", Routes: []string{edgeconfig.AllRoutes}}
	start := func(model string) error {
		plan, err := d.Resolve(all, model)
		if err != nil {
			return err
		}
		_, err = d.StartRun(t.Context(), &plan, &wirepb.RunRequest{}, Watch{})
		return err
	}
	if err := start("ghost"); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("a model nobody offers: %v, want ErrUnknownModel", err)
	}
	if err := start("routed"); !errors.Is(err, sched.ErrNoCandidate) || errors.Is(err, ErrUnknownModel) {
		t.Errorf("a routed model with no Node: %v, want no_candidate", err)
	}
	c := reg.Register(fleet.ConnInfo{NodeID: "n1", Providers: []*wirepb.Provider{{Name: "p", Adapter: "ollama", Capacity: 1,
		State: wirepb.ProviderState_PROVIDER_STATE_ONLINE, Targets: []*wirepb.Target{{Name: "gone:latest"}}}}})
	reg.Fence(c, quicwire.CloseHeartbeatTimeout, "test")
	if err := start("gone"); !errors.Is(err, sched.ErrNoCandidate) || errors.Is(err, ErrUnknownModel) {
		t.Errorf("a model whose only Node is fenced: %v, want no_candidate (known, unavailable)", err)
	}
}
