// Package execution is the Node's execution side: its providers (adapter
// plugins under supervision, with capacity), and the handler that serves
// the streams the Edge dispatches: normalized runs, tunnels, embedding
// calls and the closed set of commands.
package execution

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/internal/node/nodemetrics"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire/lease"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Handler serves dispatched streams. It implements edgeclient.Handler.
type Handler struct {
	set    *Set
	log    *slog.Logger
	status func() edgeclient.Status
	live   Liveness
	leases *lease.Opener
	// metrics counts lease refusals; unnamed, the calls that name no
	// provider of this Node (each provider counts its own).
	metrics *nodemetrics.Metrics
	unnamed *nodemetrics.Provider
	waker   *Waker // wake.go
}

// HandlerOptions configure a Handler.
type HandlerOptions struct {
	// Status reports the transport's state for the transport_status
	// command.
	Status func() edgeclient.Status
	// Stall is how stalls are finished; zero fields take their defaults.
	Stall Liveness
	// Leases opens credential leases (R11). Nil refuses every run or
	// tunnel that carries one.
	Leases *lease.Opener
	// Metrics records lease refusals and the calls that name no provider
	// of this Node; nil records nothing. Each provider records its own
	// calls (ProviderConfig.Metrics).
	Metrics *nodemetrics.Metrics
	// Waker sends the wake-on-LAN packets COMMAND_KIND_WAKE asks for
	// (wake.go); nil has no targets.
	Waker *Waker
}

var _ edgeclient.Handler = (*Handler)(nil)

// NewHandler returns a handler for the providers in set.
func NewHandler(set *Set, log *slog.Logger, opts HandlerOptions) *Handler {
	if opts.Status == nil {
		opts.Status = func() edgeclient.Status { return edgeclient.Status{} }
	}
	return &Handler{set: set, log: log, status: opts.Status, live: opts.Stall, leases: opts.Leases,
		metrics: opts.Metrics, unnamed: opts.Metrics.Provider(""), waker: opts.Waker}
}

// ServeStream implements edgeclient.Handler.
func (h *Handler) ServeStream(ctx context.Context, sess *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream) {
	switch k := hdr.GetKind().(type) {
	case *wirepb.StreamHeader_Run:
		h.serveRun(ctx, sess, k.Run, st)
	case *wirepb.StreamHeader_Command:
		_ = st.Send(h.command(sess, k.Command))
	case *wirepb.StreamHeader_Tunnel:
		h.serveTunnel(ctx, sess, k.Tunnel, st)
	case *wirepb.StreamHeader_Embed:
		h.serveEmbed(ctx, sess, k.Embed, st)
	}
}

// command answers one command. Commands are a closed set (R10).
func (h *Handler) command(sess *transport.Session, c *wirepb.CommandRequest) *wirepb.CommandResult {
	res := &wirepb.CommandResult{CommandId: c.GetCommandId(), SessionId: c.GetSessionId()}
	switch c.GetKind() {
	case wirepb.CommandKind_COMMAND_KIND_CAPABILITIES:
		res.Providers = h.set.Snapshot()
	case wirepb.CommandKind_COMMAND_KIND_TRANSPORT_STATUS:
		st := h.status()
		res.TransportStatus = &wirepb.TransportStatus{
			NodeId:               sess.NodeID(),
			Generation:           sess.Generation(),
			State:                string(st.State),
			LastHeartbeatRttUs:   st.LastRTT.Microseconds(),
			HealthObservationSeq: sess.HealthObservationSeq(),
			ConnectedUnixMs:      sess.ConnectedAt().UnixMilli(),
		}
	case wirepb.CommandKind_COMMAND_KIND_WAKE:
		h.wake(c, res)
	case wirepb.CommandKind_COMMAND_KIND_OLLAMA_API_TUNNEL:
		res.Failure = &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED, Message: "the Ollama API tunnel is not served by this node version"}
	default:
		res.Failure = &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED,
			Message: fmt.Sprintf("unknown command kind %d: commands are capabilities, transport_status, ollama_api_tunnel and wake", c.GetKind())}
	}
	return res
}
