package execution

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// Liveness is how the Node guards a provider call once it has started
// (R5, R6): the close grace and the probe deadline of a stall. The stall
// timeout itself comes with each request (R4).
type Liveness struct {
	// CloseGrace bounds the wait for a stalled call to return after it is
	// cancelled; 0 means DefaultCloseGrace.
	CloseGrace time.Duration
	// ProbeTimeout is the deadline of the exact-target probe run after a
	// stall, and of each recovery probe of an unavailable target; 0 means
	// DefaultProbeTimeout.
	ProbeTimeout time.Duration
}

// guard is what every provider call (a normalized run, a raw tunnel or an
// embedding call) runs under: the call's context, which ends with the
// connection, the hard deadline, the Edge's cancel or a stall; the claim
// of its one outcome (S5); and the stall watchdog.
type guard struct {
	claim  *Claim
	wd     *Watchdog
	ctx    context.Context // the call's
	cancel context.CancelCauseFunc
	conn   context.Context // the connection's
	stopDL context.CancelFunc
	// unwatch stops watching the stream for the Edge's cancel, if that
	// watch is a context's (see admitted.guard).
	unwatch func() bool

	// Set by serve before the watchdog starts, for the stall's end on the
	// timer's goroutine.
	log *callLog
	end func(Outcome)
	// stallDone is closed once the stall is finished (stallEnded says
	// whether it ended the call; if not, a deadline or a disconnect took
	// the outcome over at the stall's instant).
	stallDone  chan struct{}
	stallEnded bool
}

// guardSpec names one call for its guard.
type guardSpec struct {
	sess       *transport.Session // nil: not bound to a connection (R7: no seq)
	prov       *Provider
	plugin     Plugin
	target     string
	stall      time.Duration
	deadlineMs int64
}

// newGuard makes the guard of one call on the connection whose context is
// conn; serve starts its watchdog.
func (h *Handler) newGuard(conn context.Context, s guardSpec) *guard {
	g := &guard{conn: conn, stopDL: func() {}, unwatch: func() bool { return false }}
	g.ctx, g.cancel = context.WithCancelCause(conn)
	if s.deadlineMs > 0 {
		g.ctx, g.stopDL = context.WithDeadline(g.ctx, time.UnixMilli(s.deadlineMs))
	}
	g.claim = NewClaim(g.ctx)
	cfg := WatchdogConfig{
		StallTimeout: s.stall,
		CloseGrace:   h.live.CloseGrace,
		ProbeTimeout: h.live.ProbeTimeout,
		Provider:     s.prov.Name(),
		Target:       s.target,
		Probe: func(ctx context.Context) (sdk.Health, error) {
			return s.plugin.Probe(ctx, s.target)
		},
		Observed: func(ev Evidence) { s.prov.observe(s.target, ev) },
	}
	if s.sess != nil {
		cfg.NextSeq = s.sess.NextHealthObservationSeq
		cfg.NodeID, cfg.Generation = s.sess.NodeID(), s.sess.Generation()
	}
	g.stallDone = make(chan struct{})
	cfg.OnStall = g.finishStall
	g.wd = NewWatchdog(cfg, g.claim, g.cancel)
	return g
}

// serve runs one provider call under g and ends it with its one outcome:
// it is the skeleton every kind of call shares. end sends the terminal of
// an outcome (and records it); serve calls it exactly once. The watchdog
// starts; call runs here, on the goroutine that serves the stream, and
// returns the plugin's own outcome (CauseNone if the plugin ended without
// one) or an error; and the outcome is claimed once: what the call
// returned, a cause that ended it from outside (S5), or a stall. A stall is
// finished and its terminal sent by the watchdog's timer (finishStall),
// while the call may still be stuck, so a waiting call holds no goroutine
// besides its own (issue 25). release frees the capacity slot once the
// call has returned: the slot is the provider's until then, so capacity
// stays honest.
func (g *guard) serve(log *callLog, release func(), call func() (Outcome, error), end func(Outcome)) {
	g.log, g.end = log, end
	g.wd.Start()
	own, err := call()
	g.wd.CallReturned()
	o := g.settle(own, err)
	if o.Cause == CauseStalled {
		if g.wd.Fenced() {
			// The stall's end may not have come yet: wait for it, so that
			// its terminal goes before the stream is finished.
			<-g.stallDone
		}
		if !g.stallEnded {
			o = Outcome{Cause: g.claim.Winner()} // a deadline or disconnect at the same instant
		}
	}
	release()
	g.unwatch()
	g.wd.Stop()
	g.stopDL()
	g.cancel(nil)
	if o.Cause != CauseStalled {
		end(o)
	}
}

// finishStall is the watchdog's OnStall, on its timer's goroutine: it
// finishes the claimed stall (cancels the call, runs the close grace and
// the probe) and ends the call with the stall's terminal, unless a
// deadline or disconnect took the outcome over at the same instant; the
// call's return then ends it. Output is fenced from the stall's claim on,
// so nothing the call sends meanwhile reaches the stream.
func (g *guard) finishStall() {
	defer close(g.stallDone)
	obs := g.wd.Finish()
	if obs == nil {
		return
	}
	g.log.Warn("provider call stalled", "stall", stallMessage(obs), "seq", obs.GetHealthObservationSeq(),
		"retryable", obs.GetRetryable(), "fenced_output", g.wd.Dropped())
	g.stallEnded = true
	g.end(Outcome{Cause: CauseStalled, Stall: obs})
}

// settle claims the outcome of a call that returned own or err. The cause
// that ended the call's context wins over what the call returned after it;
// a cause that took the outcome first (an external end, or the stall,
// which serve then finishes) wins over both.
func (g *guard) settle(own Outcome, err error) Outcome {
	o := g.returned(own, err)
	if g.claim.Take(o.Cause) {
		return o
	}
	if w := g.claim.Winner(); w != o.Cause {
		return Outcome{Cause: w}
	}
	return o
}

// returned is the outcome of a call that returned own or err, as the
// call's context tells it: why the context ended, if it did; then the
// call's error; then the plugin's own outcome.
func (g *guard) returned(own Outcome, err error) Outcome {
	reason := context.Cause(g.ctx)
	var tv *tunnelViolation
	switch {
	case g.conn.Err() != nil || errors.Is(reason, errDisconnected):
		return Outcome{Cause: CauseDisconnected}
	case errors.Is(reason, errCancelled):
		return Outcome{Cause: CauseCancelled}
	case errors.Is(reason, errEdgeProtocol):
		return failedOutcome(wirepb.FailureKind_FAILURE_KIND_PROTOCOL, "%v", reason)
	case errors.Is(g.ctx.Err(), context.DeadlineExceeded):
		return Outcome{Cause: CauseDeadline}
	case errors.As(err, &tv):
		return failedOutcome(wirepb.FailureKind_FAILURE_KIND_PROTOCOL, "%v", err)
	case err != nil:
		return Outcome{Cause: CauseFailed, Failure: pluginhost.FailureToWire(err)}
	case own.Cause == CauseNone:
		return failedOutcome(wirepb.FailureKind_FAILURE_KIND_INTERNAL, "the plugin ended the call without a terminal")
	}
	return own
}

// stop ends the call from outside for reason (errCancelled,
// errDisconnected, or a protocol error of the Edge): the outcome is
// claimed for it first, so a stall cannot take it afterwards, then the
// call is cancelled.
func (g *guard) stop(reason error) {
	g.claim.Take(causeOf(reason))
	g.cancel(reason)
}

// stallMessage is the human-readable part of a response_stalled failure:
// Node-owned facts only (R5), never payload text.
func stallMessage(o *wirepb.StallObservation) string {
	msg := "no progress for " + time.Duration(o.GetSinceLastProgressMs()*int64(time.Millisecond)).String() +
		" (stall timeout " + time.Duration(o.GetStallTimeoutMs()*int64(time.Millisecond)).String() + "); provider health " +
		o.GetProviderHealth() + " (" + o.GetLivenessClassification() + ")"
	if o.GetCloseConfirmed() {
		return msg + "; the provider call was closed"
	}
	return msg + "; the provider call did not return inside the close grace"
}

// callLog is the Node's logger for one provider call, with the attributes
// that name the call. They join each line as it is written rather than
// ahead of it, as slog's With would have them: With formats them into a
// handler of the call's own, about 0.7 KB in nine allocations on the way to
// the provider, held for as long as the call waits (issue 25). The lines
// read the same.
type callLog struct {
	log   *slog.Logger
	attrs [3]slog.Attr
	n     int
}

// callLog returns the logger of a call named by attrs, three at most:
// more is a mistake of the caller's, not dropped in silence.
func (h *Handler) callLog(attrs ...slog.Attr) *callLog {
	l := &callLog{log: h.log}
	if len(attrs) > len(l.attrs) {
		panic("execution: a call named by more than three log attributes")
	}
	l.n = copy(l.attrs[:], attrs)
	return l
}

// Info writes an Info line with the call's attributes, then args (as
// slog.Logger.Info's).
func (l *callLog) Info(msg string, args ...any) { l.write(slog.LevelInfo, msg, args) }

// Warn writes a Warn line, as Info.
func (l *callLog) Warn(msg string, args ...any) { l.write(slog.LevelWarn, msg, args) }

func (l *callLog) write(level slog.Level, msg string, args []any) {
	ctx := context.Background()
	h := l.log.Handler()
	if !h.Enabled(ctx, level) {
		return
	}
	r := slog.NewRecord(time.Now(), level, msg, 0)
	r.AddAttrs(l.attrs[:l.n]...)
	r.Add(args...)
	_ = h.Handle(ctx, r)
}
