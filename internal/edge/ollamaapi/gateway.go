package ollamaapi

import (
	"context"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/gateway"
	"github.com/iop-dev/iop/internal/edge/nodes"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// FromGateway adapts g to Runner, for Ollama providers; reg is the Node
// registry Metadata fans out over.
func FromGateway(g *gateway.Gateway, reg *nodes.Registry) Runner {
	return gatewayRunner{g: g, reg: reg}
}

type gatewayRunner struct {
	g   *gateway.Gateway
	reg *nodes.Registry
}

var _ Runner = gatewayRunner{}

func (gr gatewayRunner) StartTunnel(ctx context.Context, p auth.Principal, model string, req *wirepb.TunnelRequest, body gateway.TunnelBody, admitted func()) (Tunnel, error) {
	t, err := gr.g.StartTunnel(ctx, p, model, Adapter, req, body, admitted)
	if err != nil {
		return nil, err
	}
	return gatewayTunnel{t}, nil
}

func (gr gatewayRunner) Profile(p auth.Principal, model string) (edgeconfig.Profile, error) {
	plan, err := gr.g.Resolve(p, model, Adapter)
	return plan.Profile, err
}

func (gr gatewayRunner) Metadata(ctx context.Context, method, path string, maxBody int64) []gateway.MetadataReply {
	return gr.g.Metadata(ctx, gr.reg, Adapter, method, path, maxBody)
}

// gatewayTunnel gives *gateway.Tunnel the ID method Tunnel has.
type gatewayTunnel struct{ *gateway.Tunnel }

var _ Tunnel = gatewayTunnel{}

func (t gatewayTunnel) ID() string { return t.Tunnel.ID }

func (gr gatewayRunner) StartRun(ctx context.Context, p auth.Principal, model string, req *wirepb.RunRequest, admitted func()) (Run, error) {
	r, err := gr.g.StartRun(ctx, p, model, req, admitted)
	if err != nil {
		return nil, err
	}
	return gatewayRun{r}, nil
}

func (gr gatewayRunner) Inventory(p auth.Principal) []gateway.Offering { return gr.g.Inventory(p) }

func (gr gatewayRunner) Offered(p auth.Principal, model string) (gateway.Offering, bool) {
	return gr.g.Offered(p, model)
}

func (gr gatewayRunner) Available(p auth.Principal, model string) error {
	return gr.g.Available(p, model)
}

// gatewayRun gives *gateway.Run the ID method Run has.
type gatewayRun struct{ *gateway.Run }

func (r gatewayRun) ID() string { return r.Run.ID }
