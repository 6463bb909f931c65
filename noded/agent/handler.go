package agent

import (
	"context"
	"fmt"

	"github.com/iop-dev/iop/noded/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// handler serves the streams the Edge dispatches. Commands are a closed set
// (R10): capabilities and transport status are answered here; runs and
// tunnels need a provider, and no adapter runs in this version, so they end
// at once with one terminal failure naming the provider.
type handler struct{ agent *Agent }

var _ transport.Handler = (*handler)(nil)

func (h *handler) ServeStream(ctx context.Context, sess *quicwire.Session, hdr *wirepb.StreamHeader, st *quicwire.Stream) {
	switch k := hdr.GetKind().(type) {
	case *wirepb.StreamHeader_Command:
		_ = st.Send(h.command(sess, k.Command))
	case *wirepb.StreamHeader_Run:
		r := k.Run
		_ = st.Send(&wirepb.RunEvent{
			Seq: 1, Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, RunId: r.GetRunId(), SessionId: r.GetSessionId(),
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE,
				Message: fmt.Sprintf("provider %q is not available on node %s", r.GetProvider(), sess.NodeID())},
		})
	case *wirepb.StreamHeader_Tunnel:
		_ = st.Send(&wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Terminal{Terminal: &wirepb.TunnelTerminal{
			Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE,
				Message: fmt.Sprintf("provider %q is not available on node %s", k.Tunnel.GetProvider(), sess.NodeID())},
		}}})
	}
}

func (h *handler) command(sess *quicwire.Session, c *wirepb.CommandRequest) *wirepb.CommandResult {
	res := &wirepb.CommandResult{CommandId: c.GetCommandId(), SessionId: c.GetSessionId()}
	switch c.GetKind() {
	case wirepb.CommandKind_COMMAND_KIND_CAPABILITIES:
		res.Providers = configuredProviders(h.agent.cfg)
	case wirepb.CommandKind_COMMAND_KIND_TRANSPORT_STATUS:
		st := h.agent.client.Status()
		res.TransportStatus = &wirepb.TransportStatus{
			NodeId:               sess.NodeID(),
			Generation:           sess.Generation(),
			State:                string(st.State),
			LastHeartbeatRttUs:   st.LastRTT.Microseconds(),
			HealthObservationSeq: sess.HealthObservationSeq(),
			ConnectedUnixMs:      sess.ConnectedAt().UnixMilli(),
		}
	case wirepb.CommandKind_COMMAND_KIND_OLLAMA_API_TUNNEL:
		res.Failure = &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, Message: "no Ollama provider on this node"}
	default:
		res.Failure = &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED,
			Message: fmt.Sprintf("unknown command kind %d: commands are capabilities, transport_status and ollama_api_tunnel", c.GetKind())}
	}
	return res
}
