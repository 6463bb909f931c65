package openai

import (
	"context"

	"github.com/iop-dev/iop/sdk"
)

// TunnelRoute says how the Node reaches the server for a raw tunnel: the
// configured base URL (with its version path) and headers, and a lent
// credential as a bearer key. The Node then relays the bytes itself
// (sdk.RelayTunnel).
func (a *Adapter) TunnelRoute(context.Context) (*sdk.TunnelRoute, error) {
	c, err := a.config()
	if err != nil {
		return nil, err
	}
	// An OpenAI-compatible server (vLLM, llama.cpp's server, SGLang, TGI)
	// is started with its models and keeps them loaded: every target is
	// warm (issue 23).
	return &sdk.TunnelRoute{BaseURL: c.base.String(), Header: c.headers.Clone(), Bearer: true, Loaded: sdk.LoadedAll}, nil
}

// Tunnel relays req to the server along the adapter's route: its Path
// (path and query) is appended to base_url, so with base_url
// http://h:8000/v1 the path /chat/completions reaches
// http://h:8000/v1/chat/completions. See sdk.RelayTunnel for the rules
// (hop-by-hop headers and the caller's Authorization dropped, the bearer
// key only from req.Credential, non-2xx statuses relayed as answers). A
// Node that knows routes relays without calling it.
func (a *Adapter) Tunnel(ctx context.Context, req *sdk.TunnelRequest, resp sdk.TunnelResponse) error {
	route, err := a.TunnelRoute(ctx)
	if err != nil {
		return err
	}
	return sdk.RelayTunnel(ctx, a.client, route, req, resp)
}
