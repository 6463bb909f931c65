package ollama

import (
	"context"

	"github.com/iop-dev/iop/sdk"
)

// hopByHop are the headers that belong to one connection (RFC 9110 7.6.1):
// a configured static header may not be one of them.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

func isHopByHop(canonical string) bool { return hopByHop[canonical] }

// TunnelRoute says how the Node reaches Ollama for a raw tunnel: the
// configured base URL and static headers, and a lent credential as a bearer
// key. The Node then relays the bytes itself (sdk.RelayTunnel), and reads
// what Ollama holds loaded from its /api/ps along the same route (issue
// 23: Ollama loads a model on demand and evicts another to make room).
func (a *Adapter) TunnelRoute(context.Context) (*sdk.TunnelRoute, error) {
	s := a.cfg.Load()
	return &sdk.TunnelRoute{BaseURL: s.base.String(), Header: s.headers.Clone(), Bearer: true, Loaded: sdk.LoadedOllamaPS}, nil
}

// Tunnel relays one raw HTTP request to Ollama and streams its answer
// back, along the adapter's route (see sdk.RelayTunnel for the rules: the
// status and headers first, then the body read by read; error statuses
// relayed as answers; hop-by-hop headers and the client's Authorization
// dropped). A Node that knows routes relays without calling it.
func (a *Adapter) Tunnel(ctx context.Context, req *sdk.TunnelRequest, resp sdk.TunnelResponse) error {
	route, err := a.TunnelRoute(ctx)
	if err != nil {
		return err
	}
	return sdk.RelayTunnel(ctx, a.client, route, req, resp)
}
