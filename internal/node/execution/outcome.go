package execution

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Exactly one terminal (ARCHITECTURE.md decision 5, S5). Every provider
// call the Node makes (a normalized run, a raw tunnel, an embedding call)
// ends with one Outcome, taken by one Claim:
//
//	the call returns ─┐
//	the Edge cancels ─┤
//	the deadline     ─┼─► Claim.Take(cause) ──► the first wins ──► Outcome ──► RunEvent / TunnelTerminal
//	the connection   ─┤         ▲
//	the stall timer  ─┘         └── S5: a deadline or disconnect at the stall's instant takes it over
//
// A Cause says why the call ended; an Outcome is a Cause with what its
// terminal carries; RunEvent and TunnelTerminal are its two wire forms.

// Cause is what ended a provider call. Its zero value, CauseNone, is no
// cause yet.
type Cause uint8

// The causes, one per terminal type of the wire.
const (
	CauseNone         Cause = iota
	CauseCompleted          // the provider answered
	CauseFailed             // the provider, the adapter or the request failed
	CauseCancelled          // the Edge cancelled (R10)
	CauseDeadline           // the hard deadline passed
	CauseDisconnected       // the connection to the Edge ended
	CauseStalled            // the stall watchdog fired (R5)
)

var causeNames = [...]string{
	CauseNone:         "none",
	CauseCompleted:    "completed",
	CauseFailed:       "failed",
	CauseCancelled:    "cancelled",
	CauseDeadline:     "deadline_exceeded",
	CauseDisconnected: "disconnected",
	CauseStalled:      "response_stalled",
}

// String is the cause's name, as in the wire's terminal types.
func (c Cause) String() string {
	if int(c) < len(causeNames) {
		return causeNames[c]
	}
	return fmt.Sprintf("Cause(%d)", c)
}

// Reasons a call's context is cancelled with (context.Cause), each naming
// the cause it claims (causeOf).
var (
	errCancelled    = errors.New("cancelled by the edge")
	errDisconnected = errors.New("connection to the edge ended")
	// errEdgeProtocol ends a tunnel whose Edge sent something other than
	// body frames.
	errEdgeProtocol = errors.New("the edge sent a frame other than a request body chunk")
)

// causeOf is the cause a reason for ending a call's context claims.
func causeOf(reason error) Cause {
	switch {
	case errors.Is(reason, errDisconnected):
		return CauseDisconnected
	case errors.Is(reason, errCancelled):
		return CauseCancelled
	case errors.Is(reason, context.DeadlineExceeded):
		return CauseDeadline
	case errors.Is(reason, ErrStalled):
		return CauseStalled
	}
	return CauseFailed
}

// Outcome is how a provider call ended: its cause, and what the terminal
// of that cause carries.
type Outcome struct {
	Cause Cause
	// DoneReason and Usage are a completed call's.
	DoneReason string
	Usage      *wirepb.Usage
	// Failure is a failed call's.
	Failure *wirepb.Failure
	// Stall is a stalled call's observation (R5, R6).
	Stall *wirepb.StallObservation
}

// failedOutcome is a failure of kind.
func failedOutcome(kind wirepb.FailureKind, format string, args ...any) Outcome {
	return Outcome{Cause: CauseFailed, Failure: &wirepb.Failure{Kind: kind, Message: fmt.Sprintf(format, args...)}}
}

// refusedOutcome is a call refused before the provider was called.
func refusedOutcome(f *wirepb.Failure) Outcome { return Outcome{Cause: CauseFailed, Failure: f} }

var (
	runEventTypes = [...]wirepb.RunEventType{
		CauseNone:         wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
		CauseCompleted:    wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED,
		CauseFailed:       wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
		CauseCancelled:    wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED,
		CauseDeadline:     wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED,
		CauseDisconnected: wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED,
		CauseStalled:      wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED,
	}
	tunnelOutcomes = [...]wirepb.TunnelOutcome{
		CauseNone:         wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED,
		CauseCompleted:    wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED,
		CauseFailed:       wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED,
		CauseCancelled:    wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED,
		CauseDeadline:     wirepb.TunnelOutcome_TUNNEL_OUTCOME_DEADLINE_EXCEEDED,
		CauseDisconnected: wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED,
		CauseStalled:      wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED,
	}
)

// RunEvent is the outcome as a run's or embedding call's terminal event.
func (o Outcome) RunEvent() *wirepb.RunEvent {
	return &wirepb.RunEvent{Type: runEventTypes[o.Cause], DoneReason: o.DoneReason, Usage: o.Usage, Failure: o.Failure, Stall: o.Stall}
}

// TunnelTerminal is the outcome as a tunnel's terminal.
func (o Outcome) TunnelTerminal() *wirepb.TunnelTerminal {
	return &wirepb.TunnelTerminal{Outcome: tunnelOutcomes[o.Cause], Failure: o.Failure, Stall: o.Stall}
}

// outcomeOfRunEvent is the outcome a terminal event says.
func outcomeOfRunEvent(ev *wirepb.RunEvent) Outcome {
	o := Outcome{Cause: CauseFailed, DoneReason: ev.GetDoneReason(), Usage: ev.GetUsage(), Failure: ev.GetFailure(), Stall: ev.GetStall()}
	for c, t := range runEventTypes {
		if c != int(CauseNone) && t == ev.GetType() {
			o.Cause = Cause(c)
		}
	}
	return o
}

// outcomeOfTunnel is the outcome a tunnel terminal says.
func outcomeOfTunnel(t *wirepb.TunnelTerminal) Outcome {
	o := Outcome{Cause: CauseFailed, Failure: t.GetFailure(), Stall: t.GetStall()}
	for c, w := range tunnelOutcomes {
		if c != int(CauseNone) && w == t.GetOutcome() {
			o.Cause = Cause(c)
		}
	}
	return o
}

// Claim holds the single outcome of one provider call: the first cause to
// Take it wins. It owns the precedence rule of S5 (a deadline or a
// disconnect wins a tie with the stall timer):
//
//   - When the stall timer fires (TakeStall) it yields to the call's
//     context if that has already ended, or if its deadline is due at that
//     instant.
//   - A CauseDeadline or CauseDisconnected taken at the very instant the
//     stall was (the same reading of the clock) takes the outcome over, as
//     long as the stall's observation is not final (FinalizeStall).
//   - Anything later loses to the stall.
//
// Its methods are safe for concurrent use.
type Claim struct {
	ctx context.Context // the call's, for TakeStall

	mu      sync.Mutex
	winner  Cause
	stallAt time.Time // when the stall took the outcome
	final   bool      // the stall's observation is final: no takeover
}

// NewClaim returns the claim of a call whose context is ctx.
func NewClaim(ctx context.Context) *Claim { return &Claim{ctx: ctx} }

// Take claims the outcome for cause and reports whether it won (see Claim
// for the tie rule).
func (c *Claim) Take(cause Cause) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.winner == CauseNone:
		c.winner = cause
		return true
	case c.winner == CauseStalled && !c.final &&
		(cause == CauseDeadline || cause == CauseDisconnected) && time.Now().Equal(c.stallAt):
		c.winner = cause
		return true
	}
	return false
}

// TakeStall claims the outcome for the stall, at now (the instant the
// timer fired), unless a cause has it or the call's context preempts it.
func (c *Claim) TakeStall(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.winner != CauseNone || c.preempted(now) {
		return false
	}
	c.winner, c.stallAt = CauseStalled, now
	return true
}

// preempted reports whether the call's context already ended (other than
// by the stall), or its hard deadline is due, at now.
func (c *Claim) preempted(now time.Time) bool {
	if c.ctx.Err() != nil && !errors.Is(context.Cause(c.ctx), ErrStalled) {
		return true
	}
	dl, ok := c.ctx.Deadline()
	return ok && !now.Before(dl)
}

// FinalizeStall makes a stall's outcome final, so that no tie can take it
// over any more, and reports whether the stall still holds it.
func (c *Claim) FinalizeStall() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.winner != CauseStalled {
		return false
	}
	c.final = true
	return true
}

// Winner is the cause that holds the outcome, CauseNone while none does.
func (c *Claim) Winner() Cause {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.winner
}
