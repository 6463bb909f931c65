package sdk

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxTunnelChunk is the largest body chunk put in one TunnelFrame. It
// matches the Edge–Node wire's body chunk size (quicwire.MaxBodyChunkSize),
// so the Node relays frames without re-chunking.
const maxTunnelChunk = 64 << 10

// errTunnelOver is what a late reader of the request body sees once the
// adapter's Tunnel has returned.
var errTunnelOver = errors.New("sdk: tunnel is over")

// Tunnel relays one raw HTTP request. Exactly one terminal: claimed in
// tunnelResponse.finish, after the adapter's Tunnel has returned.
func (s *adapterServer) Tunnel(stream pluginpb.Adapter_TunnelServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	open := first.GetOpen()
	if open == nil || open.GetRequest() == nil {
		return status.Error(codes.InvalidArgument, "the first tunnel message must open it with a request")
	}
	resp := &tunnelResponse{stream: stream}
	t, ok := s.a.(Tunneler)
	if !ok {
		return resp.finish(unsupported(CapTunnel))
	}

	// The request body: a pipe fed by the stream. pumpBody ends when the
	// body ends, or when the stream does (after this handler returns).
	pr, pw := io.Pipe()
	go pumpBody(stream, pw)
	defer pr.CloseWithError(errTunnelOver) // unblocks pumpBody if the adapter stopped reading

	req := tunnelRequestFromWire(open.GetRequest(), open.GetCredential())
	req.Body = pr
	ctx := stream.Context()
	_, err = guard(s, "Tunnel", func() (struct{}, error) { return struct{}{}, t.Tunnel(ctx, req, resp) })
	if err == nil && !resp.wroteHeader() {
		err = &Error{Kind: KindInternal, Message: "adapter completed the tunnel without writing a response head"}
	}
	return resp.finish(err)
}

// pumpBody copies the request body from the stream into pw: body chunks
// until the end marker. A stream that ends without the marker aborted the
// body, and the reader sees io.ErrUnexpectedEOF.
func pumpBody(stream pluginpb.Adapter_TunnelServer, pw *io.PipeWriter) {
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			pw.CloseWithError(io.ErrUnexpectedEOF)
			return
		}
		if err != nil {
			pw.CloseWithError(err)
			return
		}
		switch m := msg.GetMsg().(type) {
		case *pluginpb.TunnelUpstream_Body:
			if _, err := pw.Write(m.Body); err != nil {
				return // the adapter is done with the body
			}
		case *pluginpb.TunnelUpstream_End:
			pw.Close()
			return
		default:
			pw.CloseWithError(fmt.Errorf("sdk: unexpected tunnel message %T after open", m))
			return
		}
	}
}

// tunnelResponse is the TunnelResponse of one tunnel: a head frame, body
// frames, then (from finish) one terminal frame.
type tunnelResponse struct {
	stream pluginpb.Adapter_TunnelServer

	mu   sync.Mutex // serializes Send on the stream; guards the fields below
	head bool
	done bool
}

// WriteHeader sends the response head, once.
func (r *tunnelResponse) WriteHeader(code int, header http.Header) error {
	if code < 100 || code > 999 {
		return &Error{Kind: KindInternal, Message: fmt.Sprintf("tunnel response status %d is not an HTTP status", code)}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return ErrHostGone
	}
	if r.head {
		return &Error{Kind: KindInternal, Message: "tunnel response head written twice"}
	}
	r.head = true
	return r.send(tunnelHead(code, header))
}

// Write sends p as body frames of at most maxTunnelChunk bytes.
func (r *tunnelResponse) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return 0, ErrHostGone
	}
	if !r.head {
		return 0, &Error{Kind: KindInternal, Message: "tunnel response body written before its head"}
	}
	n := 0
	for n < len(p) {
		chunk := p[n:min(len(p), n+maxTunnelChunk)]
		if err := r.send(&wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: chunk}}); err != nil {
			return n, err
		}
		n += len(chunk)
	}
	return n, nil
}

func (r *tunnelResponse) wroteHeader() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.head
}

// send sends f; the caller holds r.mu. The stream marshals f before Send
// returns, so the caller's buffer may be reused at once.
func (r *tunnelResponse) send(f *wirepb.TunnelFrame) error {
	if err := r.stream.Send(f); err != nil {
		return fmt.Errorf("%w: %v", ErrHostGone, err)
	}
	return nil
}

// finish sends the one terminal frame and refuses every later write.
func (r *tunnelResponse) finish(err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done = true
	if r.stream.Context().Err() != nil {
		return nil // nobody is listening; the host ends the tunnel itself
	}
	return r.stream.Send(tunnelTerminal(err))
}
