package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// The raw provider tunnel (R3), Node side. On a tunnel stream the Edge
// sends TunnelFrame{body}... then FIN; the Node answers with the
// provider's TunnelFrame{head}, {body}... and exactly one {terminal}.
//
//	Edge ──body frames, FIN──► tunnelBody ──► plugin.Tunnel ──► provider
//	Edge ◄──head, body, terminal── tunnelOut.emit ◄── plugin frames
//
// The plugin's terminal passes through when it sends one; otherwise the
// Node claims the outcome (tunnelOut.finish). Either way the first claim
// wins and nothing is sent after it.

// errEdgeProtocol is the cause of a tunnel ended because the Edge sent
// something other than body frames.
var errEdgeProtocol = errors.New("the edge sent a frame other than a request body chunk")

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

	mu       sync.Mutex
	head     bool
	terminal *wirepb.TunnelTerminal
}

// emit sends one frame from the plugin. A terminal frame from the plugin
// is claimed here (exactly one terminal: the first claim wins), even if
// sending it then fails.
func (o *tunnelOut) emit(f *wirepb.TunnelFrame) error {
	o.mu.Lock()
	defer o.mu.Unlock()
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
		o.terminal = t
	default:
		return &tunnelViolation{"empty frame"}
	}
	return o.st.Send(f)
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

func tunnelFailed(kind wirepb.FailureKind, format string, args ...any) *wirepb.TunnelTerminal {
	return &wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED,
		Failure: &wirepb.Failure{Kind: kind, Message: fmt.Sprintf(format, args...)}}
}

// serveTunnel relays one raw HTTP request to a provider's own API (R3):
// validate, admit, run the plugin's Tunnel, and end with exactly one
// terminal.
func (h *Handler) serveTunnel(ctx context.Context, sess *quicwire.Session, req *wirepb.TunnelRequest, st Stream) {
	out := &tunnelOut{st: st, ended: func() error { return nil }}
	log := h.log.With("tunnel_id", req.GetTunnelId(), "provider", req.GetProvider(), "target", req.GetTarget())

	// R4: an invalid raw stall timeout is refused before any provider
	// lookup or adapter call.
	stall, err := StallTimeout(req.GetResponseStallTimeoutMs())
	if err != nil {
		out.finish(tunnelFailed(wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST, "%v", err))
		return
	}
	prov, err := h.set.Lookup(req.GetProvider(), "", req.GetTarget())
	if err != nil {
		out.finish(tunnelFailed(wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND, "%v", err))
		return
	}
	// A tunnel takes a capacity slot like a run; a read-only metadata call
	// does not, so it answers while the provider is busy.
	var (
		plugin  Plugin
		release = func() {}
	)
	if req.GetMetadata() {
		plugin, err = prov.Current()
	} else {
		plugin, release, err = prov.Acquire()
	}
	switch {
	case errors.Is(err, ErrCapacityExhausted):
		out.finish(tunnelFailed(wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED, "%v", err))
		return
	case err != nil:
		out.finish(tunnelFailed(wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, "%v", err))
		return
	}
	// The capability of the plugin that would serve it, not of the last
	// one reported: a restart may bring another adapter build.
	if !slices.Contains(plugin.Capabilities(), sdk.CapTunnel) {
		release()
		out.finish(tunnelFailed(wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED, "provider %s (adapter %s) does not relay its raw API", prov.Name(), prov.cfg.Adapter))
		return
	}

	// R11: the lease is opened after admission, immediately before the
	// provider call; a refusal ends the tunnel without one (S4).
	cred, refused := h.openLease(sess, req.GetSealedLease(), req.GetBinding(), prov.Name(), req.GetTarget())
	if refused != nil {
		release()
		out.finish(&wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, Failure: refused})
		return
	}
	req.SealedLease = nil

	// The call's context ends with the connection, the hard deadline, the
	// Edge's cancel or a stall, whichever comes first; the guard claims
	// the outcome once (the plugin's own terminal included).
	g := h.newGuard(ctx, guardSpec{sess: sess, prov: prov, plugin: plugin, target: req.GetTarget(),
		stall: stall, deadlineMs: req.GetDeadlineUnixMs()})
	out.ended = func() error {
		if g.ctx.Err() != nil {
			return context.Cause(g.ctx)
		}
		return nil
	}
	// After the request body the Edge sends nothing more, so a cancel
	// must be seen another way: the Edge's cancel also stops reading its
	// side (STOP_SENDING), which ends the write side of st here, even
	// while the provider is silent and nothing is being written.
	if sctx := sendContext(st); sctx != nil {
		defer context.AfterFunc(sctx, func() { g.stop(writeSideEnded(context.Cause(sctx))) })()
	}
	body := &tunnelBody{st: st, cancel: g.stop}
	emit := func(f *wirepb.TunnelFrame) error {
		return g.wd.Emit(TunnelFrameIsProgress(f), func() error {
			// The plugin may end with completed or failed only (tunnelOut
			// refuses the rest); that is its claim.
			if t := f.GetTerminal(); t != nil && pluginOutcome(t) && !g.wd.Claim(tunnelClaim(t)) {
				return fmt.Errorf("tunnel outcome already claimed (%s)", g.wd.Winner())
			}
			err := out.emit(f)
			var sc *quicwire.StreamCancelledError
			if errors.As(err, &sc) {
				g.stop(errCancelled) // the Edge reset the stream: the provider's request is cancelled
			}
			return err
		})
	}

	start := time.Now()
	var callErr error
	var claim string
	callDone := make(chan struct{})
	g.wd.Start()
	go func() {
		defer close(callDone)
		callErr = plugin.Tunnel(g.ctx, req, cred, body, emit)
		g.wd.CallReturned()
		if out.claimed() == nil {
			claim = g.settle(tunnelClaim(tunnelOutcome(ctx, g.ctx, callErr)))
		}
	}()
	defer g.releaseAfter(callDone, release)

	stalled := false
	select {
	case <-callDone:
		stalled = claim == CauseStalled
	case <-g.wd.Stalled():
		stalled = true
	}
	if stalled {
		if obs := g.wd.Finish(); obs != nil {
			out.finish(&wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED, Stall: obs})
			log.Warn("tunnel stalled", "stall", stallMessage(obs), "seq", obs.GetHealthObservationSeq(),
				"retryable", obs.GetRetryable(), "fenced_frames", g.wd.Dropped())
		} else {
			<-callDone // a deadline or disconnect took the outcome at the same instant
			out.finish(tunnelTerminal(g.wd.Winner()))
		}
	} else if out.claimed() == nil {
		err := callErr
		if err == nil {
			err = errors.New("the plugin ended the tunnel without a terminal frame")
		}
		term := tunnelOutcome(ctx, g.ctx, err)
		if earlyEnd(claim) && claim != tunnelClaim(term) {
			term = tunnelTerminal(claim)
		}
		out.finish(term)
	}
	term := out.claimed()
	log.Info("tunnel ended", "outcome", term.GetOutcome().String(), "failure", term.GetFailure().GetKind().String(),
		"took", time.Since(start), "err", callErr)
}

func pluginOutcome(t *wirepb.TunnelTerminal) bool {
	o := t.GetOutcome()
	return o == wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED || o == wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED
}

// tunnelClaim is the claim a tunnel terminal makes.
func tunnelClaim(t *wirepb.TunnelTerminal) string {
	switch t.GetOutcome() {
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED:
		return CauseCompleted
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED:
		return CauseCancelled
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_DEADLINE_EXCEEDED:
		return CauseDeadline
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED:
		return CauseDisconnected
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED:
		return CauseStalled
	}
	return CauseFailed
}

// tunnelOutcome is the Node's terminal for a plugin call that ended without
// one. The cause that ended the tunnel's context wins over the error the
// plugin call returned after it.
func tunnelOutcome(conn, tctx context.Context, err error) *wirepb.TunnelTerminal {
	cause := context.Cause(tctx)
	var tv *tunnelViolation
	switch {
	case conn.Err() != nil || errors.Is(cause, errDisconnected):
		return &wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED}
	case errors.Is(cause, errCancelled):
		return &wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED}
	case errors.Is(cause, errEdgeProtocol):
		return tunnelFailed(wirepb.FailureKind_FAILURE_KIND_PROTOCOL, "%v", cause)
	case errors.Is(tctx.Err(), context.DeadlineExceeded):
		return &wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_DEADLINE_EXCEEDED}
	case errors.As(err, &tv):
		return tunnelFailed(wirepb.FailureKind_FAILURE_KIND_PROTOCOL, "%v", err)
	}
	return &wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, Failure: pluginhost.FailureToWire(err)}
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
