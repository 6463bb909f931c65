package nodeserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// finWait bounds the wait for the Node's FIN after its terminal frame. The
// Node finishes its half as soon as the terminal is sent; the wait only
// checks that nothing follows the terminal, and a Node that neither sends
// more nor finishes does not hold the terminal back for longer than this.
const finWait = 5 * time.Second

// TunnelError is how a tunnel that did not complete ends (R3): its one
// terminal outcome, with the failure, as the Node claimed it or as the
// Edge made it when the stream ended without one.
type TunnelError struct {
	Outcome wirepb.TunnelOutcome
	Failure *wirepb.Failure
	// Stall is the Node's observation of a RESPONSE_STALLED outcome.
	Stall *wirepb.StallObservation
	// Err is the local cause of a terminal the Edge made (the context's
	// error, the disconnect, the request body's read error, the stream
	// error); nil for the Node's own terminal.
	Err error
}

func (e *TunnelError) Error() string {
	msg := "tunnel " + e.Outcome.String()
	if f := e.Failure; f != nil {
		msg += fmt.Sprintf(" (%s): %s", f.GetKind(), f.GetMessage())
	} else if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the local cause, so that errors.Is(err, context.Canceled)
// or quicwire.ErrDisconnected works on a terminal the Edge made.
func (e *TunnelError) Unwrap() error { return e.Err }

// TunnelStream is a raw provider tunnel dispatched to a Node (R3): the
// request body goes out on its own goroutine while the response is read
// with Head and Read. It always ends with exactly one terminal outcome:
// the Node's, or one the Edge makes when the stream ends without one
// (disconnect, cancel, protocol error).
//
// Head, Read, Terminal and Close are called from one goroutine; cancelling
// the Tunnel's ctx may happen anywhere.
type TunnelStream struct {
	d    *Dispatched
	ctx  context.Context
	stop func() bool
	// What a completed tunnel is observed under (ObserveCompleted), not
	// the whole request: that goes with the header and is not kept while
	// the tunnel waits (P3).
	metadata         bool
	provider, target string

	// The request body sender's side.
	finSent atomic.Bool // the whole body and the FIN were sent
	mu      sync.Mutex
	bodyErr error // why the request body could not be read

	// amu orders Abandon against the response head: a tunnel is abandoned
	// only while no head has come.
	amu       sync.Mutex
	headSeen  bool
	abandoned error

	head  *wirepb.TunnelResponseHead
	buf   []byte // the unread rest of the current body frame
	term  *wirepb.TunnelTerminal
	err   error // what Head and Read return after the end
	ended bool
}

// Tunnel relays one HTTP request to a provider's own API through node
// nodeID (R3). A body that says its length (a bytes.Reader, say) and fits
// one frame goes in the same write as the request, with the FIN right
// after; any other body is sent in frames of at most
// quicwire.MaxBodyChunkSize, by its own goroutine, then the Edge's half is
// finished (FIN); nil means no body. A body read error cancels the tunnel.
// That goroutine ends when the body is sent, or at its first Read or Send
// after the tunnel ended; a caller whose body can block in Read should
// unblock it (close it) once the tunnel is over.
//
// Cancelling ctx cancels the tunnel on the Node (R10), which cancels the
// provider's request; it ends that tunnel only.
func (s *Server) Tunnel(ctx context.Context, nodeID string, req *wirepb.TunnelRequest, body io.Reader) (*TunnelStream, error) {
	hdr := &wirepb.StreamHeader{Kind: &wirepb.StreamHeader_Tunnel{Tunnel: req}}
	var (
		first []proto.Message
		err   error
	)
	whole := body == nil
	if b, ok := body.(lenReader); ok && b.Len() <= quicwire.MaxBodyChunkSize {
		// A body that fits one frame travels with the header, and the FIN
		// right after: one write, no sender goroutine.
		if first, err = smallBody(b); err != nil {
			return nil, err
		}
		whole = true
	}
	d, err := s.Dispatch(ctx, nodeID, hdr, first...)
	if err != nil {
		return nil, err
	}
	t := &TunnelStream{d: d, ctx: ctx, metadata: req.GetMetadata(), provider: req.GetProvider(), target: req.GetTarget()}
	t.stop = context.AfterFunc(ctx, func() { d.Cancel(quicwire.StreamCancelled) })
	if whole {
		if d.CloseSend() == nil {
			t.finSent.Store(true)
		}
	} else {
		go t.sendBody(body)
	}
	return t, nil
}

// lenReader is a body that knows how much of it is left (bytes.Reader,
// strings.Reader, bytes.Buffer).
type lenReader interface {
	io.Reader
	Len() int
}

// smallBody reads all of b (no more than one frame's worth) into the body
// frame it travels in; an empty body is no frame.
func smallBody(b lenReader) ([]proto.Message, error) {
	n := b.Len()
	if n == 0 {
		return nil, nil
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(b, buf); err != nil {
		return nil, fmt.Errorf("tunnel: reading the request body: %w", err)
	}
	return []proto.Message{&wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: buf}}}, nil
}

// sendBody streams the request body to the Node, chunk by chunk as the
// body yields it (no waiting to fill a chunk), then the FIN. QUIC flow
// control paces it: a Node (and provider) that reads slowly slows it.
func (t *TunnelStream) sendBody(body io.Reader) {
	buf := make([]byte, quicwire.MaxBodyChunkSize)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			// Send marshals the frame before it returns: buf is reusable.
			if t.d.Send(&wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: buf[:n]}}) != nil {
				return // the stream is over; the response side says why
			}
		}
		switch {
		case err == io.EOF:
			if t.d.CloseSend() == nil {
				t.finSent.Store(true)
			}
			return
		case err != nil:
			t.mu.Lock()
			t.bodyErr = err
			t.mu.Unlock()
			t.d.Cancel(quicwire.StreamCancelled)
			return
		}
	}
}

// Generation is the Node generation the tunnel was dispatched on.
func (t *TunnelStream) Generation() uint64 { return t.d.Conn.Generation() }

// Head waits for the response head. If the tunnel ends before a head, it
// returns the terminal as a *TunnelError.
func (t *TunnelStream) Head() (*wirepb.TunnelResponseHead, error) {
	if t.head != nil {
		return t.head, nil
	}
	if t.ended {
		return nil, t.err
	}
	f, ok := t.recv()
	if !ok {
		return nil, t.err
	}
	t.amu.Lock()
	abandoned := t.abandoned
	t.headSeen = abandoned == nil
	t.amu.Unlock()
	if abandoned != nil { // what came is dropped: the tunnel was given up
		t.end(abandonedTerminal(abandoned))
		return nil, t.err
	}
	switch fr := f.GetFrame().(type) {
	case *wirepb.TunnelFrame_Head:
		t.head = fr.Head
		return t.head, nil
	case *wirepb.TunnelFrame_Terminal:
		if fr.Terminal.GetOutcome() == wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED {
			t.end(protocolTerminal(errors.New("tunnel completed without a response head")))
		} else {
			t.endWithNodeTerminal(fr.Terminal)
		}
	case *wirepb.TunnelFrame_Body:
		t.end(protocolTerminal(errors.New("body before the response head")))
	default:
		t.end(protocolTerminal(errors.New("empty tunnel frame")))
	}
	return nil, t.err
}

// Read reads the response body as the provider flushed it: it hands out
// the current body frame's bytes, then reads the next frame, so nothing is
// buffered beyond one frame and a slow reader slows the Node (through QUIC
// flow control). It returns io.EOF at a COMPLETED terminal and a
// *TunnelError for any other terminal, the Node's or one the Edge made.
func (t *TunnelStream) Read(p []byte) (int, error) {
	if err := t.fill(); err != nil {
		return 0, err
	}
	n := copy(p, t.buf)
	t.buf = t.buf[n:]
	return n, nil
}

// NextPiece is Read without a copy: it returns the rest of the current body
// frame, or the next frame's body, whole, as the Node sent it (what the
// provider flushed together). The bytes are the caller's: nothing here
// uses them again. A relay that writes each piece as it comes needs no
// buffer of its own (issue 25: it had a 64 KiB one per answer being
// relayed, ~4.5 MiB of the Edge's peak at 64 streams). It ends as Read
// does.
func (t *TunnelStream) NextPiece() ([]byte, error) {
	if err := t.fill(); err != nil {
		return nil, err
	}
	p := t.buf
	t.buf = nil
	return p, nil
}

// fill makes t.buf hold body bytes, reading frames until one brings some,
// or returns how the tunnel ended.
func (t *TunnelStream) fill() error {
	if t.head == nil {
		if _, err := t.Head(); err != nil {
			return err
		}
	}
	for len(t.buf) == 0 {
		if t.ended {
			return t.err
		}
		f, ok := t.recv()
		if !ok {
			return t.err
		}
		switch fr := f.GetFrame().(type) {
		case *wirepb.TunnelFrame_Body:
			t.buf = fr.Body
		case *wirepb.TunnelFrame_Terminal:
			t.endWithNodeTerminal(fr.Terminal)
		case *wirepb.TunnelFrame_Head:
			t.end(protocolTerminal(errors.New("a second response head")))
		default:
			t.end(protocolTerminal(errors.New("empty tunnel frame")))
		}
	}
	return nil
}

// Ready reports whether Read can return more without waiting: the rest of
// the current body frame, or a next frame that has arrived whole. A relay
// then writes it before it flushes. The terminal is not ready: Read waits
// for the Node's FIN after it (endWithNodeTerminal), and the answer's last
// line is not held for that. Call it from the goroutine that reads.
func (t *TunnelStream) Ready() bool {
	if len(t.buf) > 0 {
		return true
	}
	if t.ended {
		return false
	}
	m := t.d.Next()
	return m != nil && !terminalFrame(m)
}

// tunnelTerminalField is the field of TunnelFrame's terminal.
var tunnelTerminalField = (&wirepb.TunnelFrame{}).ProtoReflect().Descriptor().Fields().ByName("terminal").Number()

// terminalFrame reports whether m, an encoded TunnelFrame, is a terminal:
// its one field comes first.
func terminalFrame(m []byte) bool {
	num, typ, n := protowire.ConsumeTag(m)
	return n > 0 && num == tunnelTerminalField && typ == protowire.BytesType
}

// Terminal is the tunnel's single terminal outcome, once Head or Read has
// returned an error (nil before): the Node's, or the one the Edge made.
func (t *TunnelStream) Terminal() *wirepb.TunnelTerminal { return t.term }

// Abandon gives up a tunnel whose response head has not come, because of
// cause (its Node turned suspect, P4): the tunnel is cancelled on the Node,
// and Head returns a DISCONNECTED *TunnelError whose failure says cause, so
// the work can move to another candidate. It reports false, and does
// nothing, once Head has returned a head. Safe to call from any goroutine.
func (t *TunnelStream) Abandon(cause error) bool {
	t.amu.Lock()
	defer t.amu.Unlock()
	if t.headSeen || t.abandoned != nil {
		return false
	}
	t.abandoned = cause
	t.d.Cancel(quicwire.StreamCancelled)
	return true
}

// Abandoned reports whether Abandon ended the tunnel.
func (t *TunnelStream) Abandoned() bool {
	t.amu.Lock()
	defer t.amu.Unlock()
	return t.abandoned != nil
}

// abandonedTerminal is the terminal of a tunnel given up by Abandon.
func abandonedTerminal(cause error) (*wirepb.TunnelTerminal, error) {
	return &wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED,
		Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, Message: cause.Error(), Retryable: true}}, cause
}

// Close abandons the tunnel if it has not ended, cancelling it on the Node.
func (t *TunnelStream) Close() {
	if !t.ended {
		t.end(&wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED}, errors.New("tunnel closed by the edge"))
	}
}

// recv reads the next frame. When the stream ends without one, it makes
// the terminal (the tunnel has then ended) and reports false.
func (t *TunnelStream) recv() (*wirepb.TunnelFrame, bool) {
	f := new(wirepb.TunnelFrame)
	err := t.d.Recv(f)
	if err == nil {
		return f, true
	}
	t.mu.Lock()
	bodyErr := t.bodyErr
	t.mu.Unlock()
	t.amu.Lock()
	abandoned := t.abandoned
	t.amu.Unlock()
	switch {
	case abandoned != nil:
		t.end(abandonedTerminal(abandoned))
	case t.ctx.Err() != nil:
		t.end(&wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED}, context.Cause(t.ctx))
	case bodyErr != nil:
		t.end(&wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST, Message: "reading the request body: " + bodyErr.Error()}},
			bodyErr)
	case busy(err):
		t.end(&wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, Failure: t.d.busyFailure()}, nil)
	case errors.Is(err, quicwire.ErrDisconnected):
		t.end(&wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, Message: err.Error(), Retryable: true}}, err)
	case err == io.EOF:
		t.end(protocolTerminal(errors.New("tunnel stream ended without a terminal frame")))
	default:
		t.end(protocolTerminal(err))
	}
	return nil, false
}

// endWithNodeTerminal takes the Node's terminal, once the stream shows
// nothing follows it: a frame after the terminal is a protocol failure.
func (t *TunnelStream) endWithNodeTerminal(term *wirepb.TunnelTerminal) {
	switch term.GetOutcome() {
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_UNSPECIFIED:
		t.end(protocolTerminal(errors.New("terminal frame without an outcome")))
		return
	}
	_ = t.d.Raw().SetReadDeadline(time.Now().Add(finWait))
	err := t.d.Recv(new(wirepb.TunnelFrame))
	if err == nil {
		t.end(protocolTerminal(fmt.Errorf("frame after the terminal (%s)", term.GetOutcome())))
		return
	}
	// io.EOF as expected; anything else (a slow or lost FIN) leaves the
	// terminal as the Node claimed it.
	t.end(term, nil)
}

// protocolTerminal is the FAILED protocol terminal the Edge makes for a
// stream that broke the tunnel's frame order.
func protocolTerminal(err error) (*wirepb.TunnelTerminal, error) {
	return &wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED,
		Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROTOCOL, Message: err.Error()}}, err
}

// end records the one terminal and finishes the stream: Finish after the
// Node's outcome once the whole request went out, Cancel otherwise (what
// is left of the request body is not needed, or the tunnel is abandoned).
// Exactly one terminal: claimed here.
func (t *TunnelStream) end(term *wirepb.TunnelTerminal, cause error) {
	if t.ended {
		return
	}
	t.ended, t.term, t.buf = true, term, nil
	t.stop()
	if term.GetOutcome() == wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED {
		t.err = io.EOF
	} else {
		t.err = &TunnelError{Outcome: term.GetOutcome(), Failure: term.GetFailure(), Stall: term.GetStall(), Err: cause}
	}
	switch term.GetOutcome() {
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED:
		t.d.observe(term.GetStall())
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED:
		if !t.metadata {
			t.d.srv.reg.ObserveCompleted(t.d.Conn, t.provider, t.target)
		}
	}
	switch {
	case term.GetFailure().GetKind() == wirepb.FailureKind_FAILURE_KIND_PROTOCOL && cause != nil:
		t.d.Cancel(quicwire.StreamProtocolError)
	case cause != nil:
		t.d.Cancel(quicwire.StreamCancelled)
	case t.finSent.Load():
		t.d.Finish()
	default:
		// The Node ended the tunnel before the whole body went out. The
		// sender may be mid-Send: a cancel (unlike a FIN) may race it.
		t.d.Cancel(quicwire.StreamDone)
	}
}
