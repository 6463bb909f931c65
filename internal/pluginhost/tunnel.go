package pluginhost

import (
	"context"
	"errors"
	"io"

	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// bodyChunk is the largest request body chunk sent to the plugin in one
// message.
const bodyChunk = 64 << 10

// Tunnel relays one raw HTTP request through the adapter (capability
// tunnel; without it the error matches sdk.ErrUnsupported). body is the
// request body, read to EOF and streamed to the plugin; nil means none.
// emit receives the plugin's frames in order: the response head, body
// chunks, and the one terminal frame (completed, or failed with its
// Failure). Tunnel returns nil once the terminal was emitted.
//
// Without a terminal it returns an error and the caller claims the
// tunnel's outcome itself: ctx.Err() when ctx ended, an error matching
// ErrPluginExited and sdk.ErrUnavailable when the process died, ErrProtocol
// for frames out of order, or emit's own error (which cancels the stream).
//
// The request body is read by a goroutine. Tunnel does not wait for a Read
// that is blocked: that goroutine ends when the Read returns, and reads no
// more after Tunnel has returned. A caller whose body can block should
// unblock it when the tunnel ends.
func (p *Plugin) Tunnel(ctx context.Context, req *wirepb.TunnelRequest, cred *sdk.Credential, body io.Reader, emit func(*wirepb.TunnelFrame) error) error {
	if err := p.usable(sdk.CapTunnel); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream and stops the body sender
	stream, err := p.rpc.Tunnel(ctx)
	if err != nil {
		return p.callErr(ctx, err)
	}
	open := &pluginpb.TunnelUpstream{Msg: &pluginpb.TunnelUpstream_Open{Open: &pluginpb.TunnelOpen{
		Request: withoutLease(req), Credential: credentialToWire(cred),
	}}}
	if err := stream.Send(open); err != nil {
		// Send reports a broken stream as io.EOF; Recv below says why.
		if !errors.Is(err, io.EOF) {
			return p.callErr(ctx, err)
		}
	} else {
		go sendBody(ctx, stream, body)
	}

	id := req.GetTunnelId()
	head := false
	for {
		f, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return p.protocolErr("tunnel %q ended without a terminal frame", id)
		}
		if err != nil {
			return p.callErr(ctx, err)
		}
		switch f.GetFrame().(type) {
		case *wirepb.TunnelFrame_Head:
			if head {
				return p.protocolErr("tunnel %q: a second response head", id)
			}
			head = true
		case *wirepb.TunnelFrame_Body:
			if !head {
				return p.protocolErr("tunnel %q: body before the response head", id)
			}
		case *wirepb.TunnelFrame_Terminal:
			t := f.GetTerminal()
			switch t.GetOutcome() {
			case wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED:
				if !head {
					return p.protocolErr("tunnel %q completed without a response head", id)
				}
			case wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED:
				if t.GetFailure() == nil {
					return p.protocolErr("tunnel %q failed without a failure", id)
				}
			default:
				// The other outcomes are the Node's to claim.
				return p.protocolErr("tunnel %q: plugin sent outcome %v", id, t.GetOutcome())
			}
			if !endsAfterTerminal(stream.Recv) {
				return p.protocolErr("tunnel %q: frame after the terminal frame", id)
			}
			return emit(f)
		default:
			return p.protocolErr("tunnel %q: empty frame", id)
		}
		if err := emit(f); err != nil {
			return err
		}
	}
}

// sendBody streams body to the plugin, then the end marker. A body that
// fails to read is cut short without the marker, which the adapter sees
// as an aborted body. It stops at the first failed Send (the stream is
// over; Tunnel's Recv says why).
func sendBody(ctx context.Context, stream pluginpb.Adapter_TunnelClient, body io.Reader) {
	if body != nil {
		buf := make([]byte, bodyChunk)
		for {
			n, err := body.Read(buf)
			if ctx.Err() != nil {
				return
			}
			if n > 0 {
				msg := &pluginpb.TunnelUpstream{Msg: &pluginpb.TunnelUpstream_Body{Body: buf[:n]}}
				if stream.Send(msg) != nil {
					return
				}
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				_ = stream.CloseSend()
				return
			}
		}
	}
	if stream.Send(&pluginpb.TunnelUpstream{Msg: &pluginpb.TunnelUpstream_End{End: &pluginpb.TunnelBodyEnd{}}}) == nil {
		_ = stream.CloseSend()
	}
}
