package dispatch

import (
	"testing"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// overRegistry is a dispatcher over a real scheduler and registry, with
// the configuration of yaml after a loopback Edge's listen and identity;
// nothing is ever dispatched (the Node server has no connections).
func overRegistry(t *testing.T, yaml string) (*Dispatcher, *fleet.Registry) {
	t.Helper()
	cfg, err := edgeconfig.Parse([]byte("listen: {http: \"127.0.0.1:8080\", quic: \"127.0.0.1:7443\"}\nidentity: {mode: loopback}\n" + yaml))
	if err != nil {
		t.Fatal(err)
	}
	reg := fleet.New(fleet.Options{})
	s := sched.New(reg, sched.Options{})
	return New(cfg, SchedulerSlots(s), ServerNodes(nodeserver.NewServer(nodeserver.Options{}, reg)), Options{}), reg
}

// readyNode registers info's Node and makes it ready with providers.
func readyNode(t *testing.T, reg *fleet.Registry, info fleet.ConnInfo, providers ...*wirepb.Provider) *fleet.Conn {
	t.Helper()
	c := reg.Register(info)
	if err := reg.MarkReady(c, c.Generation(), providers); err != nil {
		t.Fatal(err)
	}
	return c
}

// planFor resolves model for a principal that may use every route.
func planFor(t *testing.T, d *Dispatcher, model string) Plan {
	t.Helper()
	p, err := d.Resolve(auth.Principal{Name: "a", Routes: []string{edgeconfig.AllRoutes}}, model)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
