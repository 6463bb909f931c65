package bridge

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/iop-dev/iop/quicwire"
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

// guard is what every provider call (a normalized run or a raw tunnel)
// runs under: the call's context, which ends with the connection, the hard
// deadline, the Edge's cancel or a stall; and the stall watchdog, which is
// the single place the outcome is claimed (decision 5, S5).
type guard struct {
	wd     *Watchdog
	ctx    context.Context // the call's context
	cancel context.CancelCauseFunc
	conn   context.Context // the connection's
	stopDL context.CancelFunc
}

// guardSpec names one call for its guard.
type guardSpec struct {
	sess       *quicwire.Session // nil: not bound to a connection (R7: no seq)
	prov       *Provider
	plugin     Plugin
	target     string
	stall      time.Duration
	deadlineMs int64
}

// newGuard makes the guard of one call; start the watchdog with g.wd.Start
// when the call starts.
func (h *Handler) newGuard(conn context.Context, s guardSpec) *guard {
	g := &guard{conn: conn, stopDL: func() {}}
	g.ctx, g.cancel = context.WithCancelCause(conn)
	if s.deadlineMs > 0 {
		g.ctx, g.stopDL = context.WithDeadline(g.ctx, time.UnixMilli(s.deadlineMs))
	}
	cfg := WatchdogConfig{
		StallTimeout: s.stall,
		CloseGrace:   h.live.CloseGrace,
		ProbeTimeout: h.live.ProbeTimeout,
		Ctx:          g.ctx,
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
	g.wd = NewWatchdog(cfg, g.cancel)
	return g
}

// call runs one provider call under g and returns its terminal: the
// watchdog starts, call runs on its own goroutine (so that a stall can end
// the work while the call is still stuck), and the outcome is claimed once:
// what the call returned, a cause that ended it early (S5), or a stall,
// whose observation then makes the terminal (R5, R6). release frees the
// capacity slot once the call has returned. ctx is the connection's.
func (g *guard) call(ctx context.Context, log *slog.Logger, release func(), call func() (*wirepb.RunEvent, error)) *wirepb.RunEvent {
	// ret is written before callDone closes.
	var ret struct {
		term  *wirepb.RunEvent
		claim string
	}
	callDone := make(chan struct{})
	g.wd.Start()
	go func() {
		defer close(callDone)
		term, err := call()
		g.wd.CallReturned()
		ret.term = outcome(ctx, g.ctx, term, err)
		ret.claim = g.settle(runClaim(ret.term))
	}()
	defer g.releaseAfter(callDone, release)

	select {
	case <-callDone:
		if ret.claim != CauseStalled {
			if earlyEnd(ret.claim) && ret.claim != runClaim(ret.term) {
				return runTerminal(ret.claim)
			}
			return ret.term
		}
	case <-g.wd.Stalled():
	}
	if obs := g.wd.Finish(); obs != nil {
		log.Warn("provider call stalled", "stall", stallMessage(obs), "seq", obs.GetHealthObservationSeq(),
			"retryable", obs.GetRetryable(), "fenced_events", g.wd.Dropped())
		return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED, Stall: obs}
	}
	<-callDone // a deadline or disconnect took the outcome at the same instant
	return runTerminal(g.wd.Winner())
}

// stop ends the call early for cause (errCancelled, errDisconnected, or a
// protocol error of the Edge): the outcome is claimed for it first, so a
// stall cannot take it afterwards, then the call is cancelled.
func (g *guard) stop(cause error) {
	g.wd.Claim(causeOf(cause))
	g.cancel(cause)
}

// releaseAfter frees the capacity slot (release) and the guard's timers
// and context once the call has returned (callDone): at once if it has, in
// the background if not (a stall whose close was not confirmed). The slot
// is the provider's until its call returns, so capacity stays honest.
func (g *guard) releaseAfter(callDone <-chan struct{}, release func()) {
	free := func() {
		release()
		g.wd.Stop()
		g.stopDL()
		g.cancel(nil)
	}
	select {
	case <-callDone:
		free()
	default:
		go func() {
			<-callDone
			free()
		}()
	}
}

// ended is the cause that ended the call's context, as the claim it
// makes: "" while the context lives or when a stall ended it.
func (g *guard) ended() string {
	if g.ctx.Err() == nil {
		return ""
	}
	if g.conn.Err() != nil {
		return CauseDisconnected
	}
	cause := context.Cause(g.ctx)
	if errors.Is(cause, ErrStalled) {
		return ""
	}
	return causeOf(cause)
}

// causeOf names the claim an early end makes.
func causeOf(cause error) string {
	switch {
	case errors.Is(cause, errDisconnected):
		return CauseDisconnected
	case errors.Is(cause, errCancelled):
		return CauseCancelled
	case errors.Is(cause, context.DeadlineExceeded):
		return CauseDeadline
	case errors.Is(cause, ErrStalled):
		return CauseStalled
	}
	return CauseFailed
}

// settle claims the outcome for a call that returned, with claim (what the
// call's own result says, or the cause that ended its context). It returns
// the winning claim; CauseStalled means the stall won and its observation
// decides the terminal.
func (g *guard) settle(claim string) string {
	if c := g.ended(); c != "" {
		claim = c // the cause that ended the context wins over the result
	}
	if g.wd.Claim(claim) {
		return claim
	}
	return g.wd.Winner()
}

// earlyEnd reports whether claim is a cause that ends a call from outside
// (its terminal is the cause's, whatever the call returned).
func earlyEnd(claim string) bool {
	return claim == CauseCancelled || claim == CauseDeadline || claim == CauseDisconnected
}

// runTerminal is the terminal of a run whose outcome was claimed by cause,
// when the call's own result does not say it (an early end).
func runTerminal(cause string) *wirepb.RunEvent {
	t := wirepb.RunEventType_RUN_EVENT_TYPE_FAILED
	switch cause {
	case CauseCancelled:
		t = wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED
	case CauseDeadline:
		t = wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED
	case CauseDisconnected:
		t = wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED
	}
	return &wirepb.RunEvent{Type: t}
}

// tunnelTerminal is runTerminal for tunnels.
func tunnelTerminal(cause string) *wirepb.TunnelTerminal {
	o := wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED
	switch cause {
	case CauseCancelled:
		o = wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED
	case CauseDeadline:
		o = wirepb.TunnelOutcome_TUNNEL_OUTCOME_DEADLINE_EXCEEDED
	case CauseDisconnected:
		o = wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED
	}
	return &wirepb.TunnelTerminal{Outcome: o}
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
