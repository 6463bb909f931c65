package execution

import (
	"context"
	"io"

	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// Plugin is one running adapter: a plugin process started through
// internal/pluginhost, or in tests anything with the same methods.
type Plugin interface {
	Capabilities() []string
	Configure(ctx context.Context, cfg sdk.Config) error
	// Execute relays the adapter's non-terminal events to emit and
	// returns its terminal, COMPLETED or FAILED, as the plugin sent it; an
	// error when the call ended without one (see pluginhost.Plugin.Execute).
	Execute(ctx context.Context, req *wirepb.RunRequest, cred *sdk.Credential, emit func(*wirepb.RunEvent) error) (*wirepb.RunEvent, error)
	ListTargets(ctx context.Context) ([]sdk.Target, error)
	Probe(ctx context.Context, target string) (sdk.Health, error)
	Tunnel(ctx context.Context, req *wirepb.TunnelRequest, cred *sdk.Credential, body io.Reader, emit func(*wirepb.TunnelFrame) error) error
	// TunnelRoute says how the Node reaches the adapter's server itself
	// for a raw tunnel (capability tunnel_route; see sdk.TunnelRouter).
	TunnelRoute(ctx context.Context) (*sdk.TunnelRoute, error)
	// Embed relays the adapter's frames of vectors to emit and returns
	// its terminal as Execute does (see pluginhost.Plugin.Embed).
	Embed(ctx context.Context, req *wirepb.EmbedRequest, cred *sdk.Credential, emit func(*wirepb.EmbedVectors) error) (*wirepb.RunEvent, error)
	// Close stops the plugin (and its process) and waits.
	Close(ctx context.Context) error
	// Exited is closed when the plugin's process has exited.
	Exited() <-chan struct{}
}

// Launcher starts a new plugin process for a provider. Each call starts a
// new one: a plugin client cannot be reused after its process exits.
type Launcher func(ctx context.Context) (Plugin, error)
