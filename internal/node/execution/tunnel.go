package execution

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/internal/shallow"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
	"google.golang.org/protobuf/proto"
)

// The raw provider tunnel (R3), Node side. On a tunnel stream the Edge
// sends TunnelFrame{body}... then FIN; the Node answers with the
// provider's TunnelFrame{head}, {body}... and exactly one {terminal}.
//
//	Edge ──body frames, FIN──► tunnelBody ──► plugin.Tunnel ──► provider
//	Edge ◄──head, body, terminal── tunnelOut.emit ◄── plugin frames
//
// The plugin's terminal passes through when it sends one (a completed or
// failed outcome, claimed as it is sent); otherwise the Node's outcome is
// sent (tunnelOut.finish). Either way the first claim wins and nothing is
// sent after it.

// tunnelViolation is a plugin frame out of order. It ends the tunnel with
// a protocol failure claimed by the Node.
type tunnelViolation struct{ msg string }

func (e *tunnelViolation) Error() string { return "tunnel: " + e.msg }

// tunnelOut is a tunnel's output side: it serializes frames to the stream
// and owns the single terminal. A plugin frame that would break the order
// (body before head, a second head, anything after the terminal) is
// refused, which makes the plugin call end. A Send blocked by flow control
// (an Edge that reads slowly: backpressure) holds the lock; the Edge's
// cancel resets the stream, which unblocks it.
type tunnelOut struct {
	st Stream
	// ended refuses further plugin frames once the tunnel's context is
	// done: the cause that ended it wins over what the plugin sends late.
	ended func() error
	// claim is the tunnel's: a plugin's terminal is sent only if it takes
	// the outcome.
	claim *Claim

	mu       sync.Mutex
	head     bool
	terminal *wirepb.TunnelTerminal
}

// emit sends one frame from the plugin or the relay. A terminal frame from
// the plugin is claimed here (exactly one terminal: the first claim wins),
// even if sending it then fails.
func (o *tunnelOut) emit(f *wirepb.TunnelFrame) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.admitLocked(f); err != nil {
		return err
	}
	return o.st.Send(f)
}

// emitPair sends a response's head and the first part of its body in one
// write, so that they leave in one packet (headHold). If either breaks the
// order, neither is sent.
func (o *tunnelOut) emitPair(head, body *wirepb.TunnelFrame) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.admitLocked(head); err != nil {
		return err
	}
	if err := o.admitLocked(body); err != nil {
		return err
	}
	if b, ok := o.st.(frameBatcher); ok {
		return b.SendFrames(head, body)
	}
	if err := o.st.Send(head); err != nil {
		return err
	}
	return o.st.Send(body)
}

// frameBatcher is a Stream that writes several frames in one write
// (transport.Stream.SendFrames): they leave in one packet.
type frameBatcher interface {
	SendFrames(ms ...proto.Message) error
}

// admitLocked checks that f may go next, and records it. o.mu is held.
func (o *tunnelOut) admitLocked(f *wirepb.TunnelFrame) error {
	if o.terminal != nil {
		return &tunnelViolation{fmt.Sprintf("frame after the terminal (%s)", o.terminal.GetOutcome())}
	}
	if err := o.ended(); err != nil {
		return err
	}
	switch f.GetFrame().(type) {
	case *wirepb.TunnelFrame_Head:
		if o.head {
			return &tunnelViolation{"a second response head"}
		}
		o.head = true
	case *wirepb.TunnelFrame_Body:
		if !o.head {
			return &tunnelViolation{"body before the response head"}
		}
	case *wirepb.TunnelFrame_Terminal:
		t := f.GetTerminal()
		switch t.GetOutcome() {
		case wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED:
			if !o.head {
				return &tunnelViolation{"completed without a response head"}
			}
		case wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED:
		default:
			// Cancelled, disconnected, stalled, deadline: the Node's to claim.
			return &tunnelViolation{fmt.Sprintf("the plugin sent outcome %s", t.GetOutcome())}
		}
		if !o.claim.Take(outcomeOfTunnel(t).Cause) {
			return fmt.Errorf("tunnel outcome already claimed (%s)", o.claim.Winner())
		}
		o.terminal = t
	default:
		return &tunnelViolation{"empty frame"}
	}
	return nil
}

// finish claims the terminal for the Node and sends it; only the first
// claim does anything. It reports whether this call was the one.
func (o *tunnelOut) finish(t *wirepb.TunnelTerminal) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.terminal != nil {
		return false
	}
	o.terminal = t
	_ = o.st.Send(&wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Terminal{Terminal: t}})
	return true
}

// claimed returns the terminal, once there is one.
func (o *tunnelOut) claimed() *wirepb.TunnelTerminal {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.terminal
}

// serveTunnel relays one raw HTTP request to a provider's own API (R3):
// validate, admit, run the plugin's Tunnel, and end with exactly one
// terminal. A metadata request (a read-only call such as a model list)
// takes no capacity slot, so it answers while the provider is busy.
//
// A management request (TunnelRequest.management: an admin's pull, delete,
// copy or create through the Edge, issue 23) takes no slot either: a pull
// lasts minutes and holds no model. Its paths are refused in any other
// tunnel (ErrManagementOnly). When it ends, the provider lists its targets
// again before the terminal is sent, so the status update with a model
// pulled or deleted is on its way as the call ends, not an interval later.
func (h *Handler) serveTunnel(ctx context.Context, sess *transport.Session, req *wirepb.TunnelRequest, st Stream) {
	// The way to the call goes deep (the lease's opening, the guard's
	// making), and this goroutine then waits for the provider's answer,
	// through a prefill for minutes: that way runs on a goroutine of its
	// own, so this one keeps only the stack of its own frames while it
	// waits (P3, issue 25; package shallow).
	var c *tunnelCall
	shallow.Call(func() { c = h.admitTunnel(ctx, sess, req, st) })
	if c != nil {
		c.serve()
	}
}

// tunnelCall is one tunnel admitted, as serveTunnel serves it.
type tunnelCall struct {
	h       *Handler
	req     *wirepb.TunnelRequest
	a       *admitted
	g       *guard
	out     *tunnelOut
	body    *tunnelBody
	log     *callLog
	unwatch func() bool // the watch of the stream's write side
	// relist is done once, before the terminal goes: the plugin's own, or
	// the Node's (end). Bounded by the listing timeout; the connection's
	// end does not stop it: a Node that reconnects registers this list.
	relisted sync.Once
	relistIn context.Context
	start    time.Time
	callErr  chan error // what the relay returned, once it has
}

// admitTunnel admits req and makes its call, or refuses it: the refusal's
// terminal sent, it returns nil.
func (h *Handler) admitTunnel(ctx context.Context, sess *transport.Session, req *wirepb.TunnelRequest, st Stream) *tunnelCall {
	out := &tunnelOut{st: st, ended: func() error { return nil }}
	log := h.callLog(slog.String("tunnel_id", req.GetTunnelId()), slog.String("provider", req.GetProvider()), slog.String("target", req.GetTarget()))

	if !req.GetManagement() && ManagementPath(req.GetPath()) {
		f := &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST, Reason: managementOnlyReason,
			Message: fmt.Sprintf("%s %s: %v", req.GetMethod(), req.GetPath(), ErrManagementOnly)}
		h.ended(tunnelKind(req), nil, refusedOutcome(f))
		log.Warn("tunnel refused: a model-management path without the management flag", "method", req.GetMethod(), "path", req.GetPath())
		out.finish(refusedOutcome(f).TunnelTerminal())
		return nil
	}
	a, refused := h.admit(sess, admission{kind: tunnelKind(req), stallMs: req.GetResponseStallTimeoutMs(), provider: req.GetProvider(),
		target: req.GetTarget(), capability: sdk.CapTunnel, noSlot: req.GetMetadata() || req.GetManagement(),
		sealed: req.GetSealedLease(), binding: req.GetBinding()})
	if refused != nil {
		if !h.refuseBusy(ctx, st, refused, req.GetProvider(), "", req.GetTarget()) {
			out.finish(refusedOutcome(refused).TunnelTerminal())
		}
		return nil
	}
	req.SealedLease = nil // the adapter gets the credential, not the lease

	g := h.newGuard(ctx, guardSpec{sess: sess, prov: a.prov, plugin: a.plugin, target: req.GetTarget(),
		stall: a.stall, deadlineMs: req.GetDeadlineUnixMs()})
	out.claim = g.claim
	out.ended = func() error {
		if g.ctx.Err() != nil {
			return context.Cause(g.ctx)
		}
		return nil
	}
	c := &tunnelCall{h: h, req: req, a: a, g: g, out: out, log: log, relistIn: ctx,
		body: &tunnelBody{st: st, cancel: g.stop}, callErr: make(chan error, 1)}
	// After the request body the Edge sends nothing more, so a cancel
	// must be seen another way: the Edge's cancel also stops reading its
	// side (STOP_SENDING), which ends the write side of st here, even
	// while the provider is silent and nothing is being written.
	if sctx := sendContext(st); sctx != nil {
		c.unwatch = context.AfterFunc(sctx, func() { g.stop(writeSideEnded(context.Cause(sctx))) })
	}
	return c
}

// serve runs the call under its guard, to its one terminal.
func (c *tunnelCall) serve() {
	if c.unwatch != nil {
		defer c.unwatch()
	}
	c.start = time.Now()
	c.g.serve(c.log, c.a.release, c.call, c.end)
}

// relist lists a management tunnel's provider again (see relisted).
func (c *tunnelCall) relist() {
	if c.req.GetManagement() {
		c.relisted.Do(func() { c.a.prov.relistNow(context.WithoutCancel(c.relistIn)) })
	}
}

// emit sends a frame of the answer under the watchdog.
func (c *tunnelCall) emit(f *wirepb.TunnelFrame) error {
	if f.GetTerminal() != nil {
		c.relist()
	}
	return c.g.wd.Emit(TunnelFrameIsProgress(f), func() error { return c.sent(c.out.emit(f)) })
}

// emitPair sends the relay's head and first body part together (headHold).
func (c *tunnelCall) emitPair(head, body *wirepb.TunnelFrame) error {
	return c.g.wd.Emit(true, func() error { return c.sent(c.out.emitPair(head, body)) })
}

// sent passes on a send's error; the Edge's reset of the stream cancels
// the provider's request.
func (c *tunnelCall) sent(err error) error {
	var sc *quicwire.StreamCancelledError
	if errors.As(err, &sc) {
		c.g.stop(errCancelled)
	}
	return err
}

// call is the provider call: the Node's relay for a route, the plugin's
// Tunnel otherwise.
func (c *tunnelCall) call() (Outcome, error) {
	if c.a.route != nil {
		// The Node moves the bytes itself: no plugin on the byte path.
		w := &frameWriter{emit: c.emit, emitPair: c.emitPair}
		w.hold = &headHold{flush: w.flushHead}
		err := sdk.RelayTunnelTransport(withHeadHold(c.g.ctx, w.hold), c.a.prov.relay.Transport, c.a.route, pluginhost.TunnelRequestFromWire(c.req, c.body, c.a.cred), w)
		w.flushHead() // a head without a body goes before the terminal
		c.callErr <- err
		return Outcome{Cause: CauseCompleted}, err
	}
	err := c.a.plugin.Tunnel(c.g.ctx, c.req, c.a.cred, c.body, c.emit)
	c.callErr <- err
	if t := c.out.claimed(); t != nil {
		return outcomeOfTunnel(t), nil // the plugin's own, already sent
	}
	if err == nil {
		err = errors.New("the plugin ended the tunnel without a terminal frame")
	}
	return Outcome{}, err
}

// end sends the Node's terminal of outcome o, unless one was sent, and
// records and logs the call's end.
func (c *tunnelCall) end(o Outcome) {
	c.relist()
	c.out.finish(o.TunnelTerminal())
	term := c.out.claimed()
	c.h.ended(tunnelKind(c.req), c.a.prov, outcomeOfTunnel(term))
	attrs := []any{"outcome", outcomeOfTunnel(term).Cause.String(), "failure", term.GetFailure().GetKind().String(), "took", time.Since(c.start)}
	select {
	case err := <-c.callErr:
		attrs = append(attrs, "err", err)
	default: // a stalled call that has not returned
	}
	c.log.Info("tunnel ended", attrs...)
}

// ErrManagementOnly refuses a tunnel to a path that changes what a model
// server holds (ManagementPath) without TunnelRequest.management: only the
// Edge's model management, which it sends for admin principals alone, may
// pull, delete, copy, create or push models, or upload blobs. A client's
// raw tunnel to its model (/api/chat, /api/show...) never reaches them.
var ErrManagementOnly = errors.New("this path changes the models the server holds: only a management tunnel (an admin's call through the Edge) may ask for it")

// managementOnlyReason is the Failure.reason of an ErrManagementOnly
// refusal.
const managementOnlyReason = "management_only"

// managementPaths are Ollama's endpoints that change what the server
// holds; "/api/blobs/" is a prefix (/api/blobs/:digest).
var managementPaths = []string{"/api/pull", "/api/delete", "/api/copy", "/api/create", "/api/push", "/api/blobs/"}

// ManagementPath reports whether p (a tunnel's path, with its query) is
// one of Ollama's model-management endpoints, as its router would see it:
// percent-decoded, cleaned ("/api//pull", "/api/x/../pull") and without
// regard to case, so that no spelling slips past the check.
func ManagementPath(p string) bool {
	p, _, _ = strings.Cut(p, "?")
	if u, err := url.PathUnescape(p); err == nil {
		p = u
	}
	p = strings.ToLower(path.Clean("/" + p))
	for _, m := range managementPaths {
		if p == m || strings.HasSuffix(m, "/") && strings.HasPrefix(p+"/", m) {
			return true
		}
	}
	return false
}

// frameWriter is the sdk.TunnelResponse of the Node's own relay: the
// response head and each body read become frames, through emit (the
// watchdog's fence and tunnelOut's order), exactly as a plugin's frames do.
type frameWriter struct {
	emit     func(*wirepb.TunnelFrame) error
	emitPair func(head, body *wirepb.TunnelFrame) error
	hold     *headHold // nil: the head goes at once
	head     *wirepb.TunnelFrame
}

// WriteHeader sends the response head, or holds it (headHold) to go with
// the first part of the body.
func (w *frameWriter) WriteHeader(status int, header http.Header) error {
	f := &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Head{Head: &wirepb.TunnelResponseHead{
		Status: int32(status), Headers: pluginpb.HeadersToWire(header)}}}
	if w.hold != nil && w.hold.enabled {
		w.head = f
		return nil
	}
	return w.emit(f)
}

// Write sends p as one body frame (the stream copies it before Write
// returns), with the head if it is held. RelayTunnel's reads are smaller
// than a frame's bound.
func (w *frameWriter) Write(p []byte) (int, error) {
	body := &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: p}}
	var err error
	if head := w.head; head != nil {
		w.head = nil
		err = w.emitPair(head, body)
	} else {
		err = w.emit(body)
	}
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// flushHead sends the head if it is held. An error is the next Write's
// too, or the call's end says why the stream ended.
func (w *frameWriter) flushHead() {
	if head := w.head; head != nil {
		w.head = nil
		_ = w.emit(head)
	}
}

// headHold lets the Node's relay send a response's head and the first
// part of its body in one write, so they cross to the Edge in one packet
// when the model server sent them together, as a streamed answer's first
// token nearly always comes (issue 25: the first byte is never held; it
// goes with the head, not behind it). It is on only where the relay's own
// client reads the answer (relayTransport, which turns enabled on): that
// client calls flush before a read of the body that would wait for the
// server, so a head whose body is not there yet goes at once, never held
// through a wait. The relay's reads and writes, and so the hold, are on
// one goroutine.
type headHold struct {
	enabled bool
	flush   func()
}

type headHoldKey struct{}

// withHeadHold returns ctx carrying h, for the relay's request.
func withHeadHold(ctx context.Context, h *headHold) context.Context {
	return context.WithValue(ctx, headHoldKey{}, h)
}

// headHoldOf is the hold ctx carries, or nil.
func headHoldOf(ctx context.Context) *headHold {
	h, _ := ctx.Value(headHoldKey{}).(*headHold)
	return h
}

// tunnelBody is the request body the plugin reads: the Edge's body frames,
// until its FIN. It is read by one goroutine (the plugin host's), which is
// not waited for: a Read blocked in Recv ends when the stream's reading
// half is finished after the handler returns.
type tunnelBody struct {
	st     Stream
	cancel func(error)
	buf    []byte // the unread rest of the current frame
	err    error  // sticky: io.EOF after FIN, or why the body broke
}

// Read implements io.Reader. A reset of the stream (the Edge's cancel)
// cancels the tunnel; so does a frame that is not a body chunk.
func (b *tunnelBody) Read(p []byte) (int, error) {
	for len(b.buf) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		f := new(wirepb.TunnelFrame)
		err := b.st.Recv(f)
		var sc *quicwire.StreamCancelledError
		switch {
		case err == io.EOF:
			b.err = io.EOF
		case errors.As(err, &sc):
			b.err = fmt.Errorf("request body: %w", err)
			b.cancel(errCancelled)
		case errors.Is(err, quicwire.ErrDisconnected):
			b.err = fmt.Errorf("request body: %w", err)
			b.cancel(errDisconnected)
		case err != nil:
			b.err = fmt.Errorf("request body: %w", err)
			b.cancel(fmt.Errorf("%w: %w", errEdgeProtocol, err))
		case f.GetFrame() == nil:
			b.err = errEdgeProtocol
			b.cancel(errEdgeProtocol)
		default:
			body, ok := f.GetFrame().(*wirepb.TunnelFrame_Body)
			if !ok {
				b.err = fmt.Errorf("%w: %T", errEdgeProtocol, f.GetFrame())
				b.cancel(b.err)
				break
			}
			b.buf = body.Body
		}
	}
	n := copy(p, b.buf)
	b.buf = b.buf[n:]
	return n, nil
}

// sendContext returns a context that ends when the write side of st ends:
// on a QUIC stream, when the Edge stops reading (its cancel) or the
// connection closes. Nil when st cannot tell.
func sendContext(st Stream) context.Context {
	switch s := st.(type) {
	case interface{ Raw() *quic.Stream }:
		return s.Raw().Context()
	case interface{ Context() context.Context }:
		return s.Context()
	}
	return nil
}

// writeSideEnded maps why the write side of a tunnel stream ended to the
// cause that ends the tunnel: the Edge's cancel, or the connection.
func writeSideEnded(cause error) error {
	var se *quic.StreamError
	var sc *quicwire.StreamCancelledError
	if errors.As(cause, &se) || errors.As(cause, &sc) {
		return errCancelled
	}
	return errDisconnected
}
