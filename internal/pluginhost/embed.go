package pluginhost

import (
	"context"
	"errors"
	"io"

	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// Embed computes one call's embeddings on the adapter. emit receives each
// frame of vectors in order, exactly as the plugin sent it, for the Node to
// relay. The plugin's one terminal is returned as it crossed the plugin
// boundary, COMPLETED (with the usage, when the server reported one) or
// FAILED (with its Failure); ResultOf reads it as sdk values. An error
// means the call ended without a terminal from the plugin:
//
//   - Without the embed capability it fails with sdk.ErrUnsupported.
//   - If the process dies mid-call, the error matches ErrPluginExited.
//   - If ctx ends, the call is cancelled and Embed returns ctx.Err().
//   - If emit fails, the call is cancelled and its error returned.
//   - Frames out of order (a frame's first index is not the number of
//     vectors before it), more vectors than inputs, a COMPLETED terminal
//     before one vector per input, a stream without a terminal or with
//     anything after it: an error matching ErrProtocol.
//
// The sealed lease and its binding are not sent to the plugin; cred is.
func (p *Plugin) Embed(ctx context.Context, req *wirepb.EmbedRequest, cred *sdk.Credential, emit func(*wirepb.EmbedVectors) error) (*wirepb.RunEvent, error) {
	if err := p.usable(sdk.CapEmbed); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream, whatever the reason we leave
	stream, err := p.rpc.Embed(ctx, &pluginpb.EmbedCall{Request: withoutLease(req), Credential: credentialToWire(cred)})
	if err != nil {
		return nil, p.callErr(ctx, err)
	}
	id, inputs := req.GetEmbedId(), len(req.GetInputs())
	got := 0
	for {
		f, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, p.protocolErr("embed %q ended without a terminal", id)
		}
		if err != nil {
			return nil, p.callErr(ctx, err)
		}
		switch fr := f.GetFrame().(type) {
		case *wirepb.EmbedFrame_Vectors:
			v := fr.Vectors
			n := len(v.GetVectors())
			if int(v.GetFirst()) != got || n == 0 || got+n > inputs {
				return nil, p.protocolErr("embed %q: a frame of %d vector(s) from index %d, after %d of %d", id, n, v.GetFirst(), got, inputs)
			}
			got += n
			if err := emit(v); err != nil {
				return nil, err
			}
		case *wirepb.EmbedFrame_Terminal:
			ev := fr.Terminal
			if !endsAfterTerminal(stream.Recv) {
				return nil, p.protocolErr("embed %q: a frame after the terminal", id)
			}
			switch ev.GetType() {
			case wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED:
				if got != inputs {
					return nil, p.protocolErr("embed %q completed with %d vector(s) for %d input(s)", id, got, inputs)
				}
				return terminalOnly(ev), nil
			case wirepb.RunEventType_RUN_EVENT_TYPE_FAILED:
				if ev.GetFailure() == nil {
					return nil, p.protocolErr("embed %q failed without a failure", id)
				}
				return terminalOnly(ev), nil
			}
			// The other terminal types are the Node's to claim.
			return nil, p.protocolErr("embed %q: plugin sent a %v terminal", id, ev.GetType())
		default:
			return nil, p.protocolErr("embed %q: an empty frame", id)
		}
	}
}
