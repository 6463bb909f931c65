package execution

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

var allCauses = []Cause{CauseCompleted, CauseFailed, CauseCancelled, CauseDeadline, CauseDisconnected, CauseStalled}

// One mapping: every cause has one terminal of each kind, each terminal is
// read back as the cause that made it, and every terminal type of the wire
// is some cause's.
func TestOutcomeMapsEveryCauseToOneTerminal(t *testing.T) {
	seenRun := map[wirepb.RunEventType]Cause{}
	seenTunnel := map[wirepb.TunnelOutcome]Cause{}
	for _, c := range allCauses {
		o := Outcome{Cause: c}
		ev, tt := o.RunEvent(), o.TunnelTerminal()
		if !ev.GetType().IsTerminal() {
			t.Errorf("%s: run event %s is not terminal", c, ev.GetType())
		}
		if got := outcomeOfRunEvent(ev).Cause; got != c {
			t.Errorf("%s: run event %s reads back as %s", c, ev.GetType(), got)
		}
		if got := outcomeOfTunnel(tt).Cause; got != c {
			t.Errorf("%s: tunnel outcome %s reads back as %s", c, tt.GetOutcome(), got)
		}
		if prev, dup := seenRun[ev.GetType()]; dup {
			t.Errorf("%s and %s share %s", prev, c, ev.GetType())
		}
		if prev, dup := seenTunnel[tt.GetOutcome()]; dup {
			t.Errorf("%s and %s share %s", prev, c, tt.GetOutcome())
		}
		seenRun[ev.GetType()], seenTunnel[tt.GetOutcome()] = c, c
		if c.String() == "" || c.String() == fmt.Sprintf("Cause(%d)", c) {
			t.Errorf("cause %d has no name", c)
		}
	}
	for n, name := range wirepb.RunEventType_name {
		if ty := wirepb.RunEventType(n); ty.IsTerminal() {
			if _, ok := seenRun[ty]; !ok {
				t.Errorf("terminal %s is no cause's", name)
			}
		}
	}
	for n, name := range wirepb.TunnelOutcome_name {
		if o := wirepb.TunnelOutcome(n); o != wirepb.TunnelOutcome_TUNNEL_OUTCOME_UNSPECIFIED {
			if _, ok := seenTunnel[o]; !ok {
				t.Errorf("tunnel outcome %s is no cause's", name)
			}
		}
	}
}

// What a terminal carries crosses into both wire forms unchanged.
func TestOutcomeCarriesItsPayload(t *testing.T) {
	f := &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_UPSTREAM, Message: "502", UpstreamStatus: 502}
	failed := Outcome{Cause: CauseFailed, Failure: f}
	if failed.RunEvent().GetFailure() != f || failed.TunnelTerminal().GetFailure() != f {
		t.Error("a failure is lost")
	}
	obs := &wirepb.StallObservation{StallTimeoutMs: 5}
	if s := (Outcome{Cause: CauseStalled, Stall: obs}); s.RunEvent().GetStall() != obs || s.TunnelTerminal().GetStall() != obs {
		t.Error("a stall observation is lost")
	}
	u := &wirepb.Usage{CompletionTokens: 3}
	done := outcomeOfRunEvent(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, DoneReason: "stop", Usage: u})
	if ev := done.RunEvent(); ev.GetDoneReason() != "stop" || ev.GetUsage() != u {
		t.Errorf("completed run event %v", ev)
	}
}

// Each reason for ending a call's context names its cause; anything else
// is a failure.
func TestCauseOf(t *testing.T) {
	for _, c := range []struct {
		reason error
		want   Cause
	}{
		{errCancelled, CauseCancelled},
		{fmt.Errorf("stream: %w", errDisconnected), CauseDisconnected},
		{context.DeadlineExceeded, CauseDeadline},
		{ErrStalled, CauseStalled},
		{errEdgeProtocol, CauseFailed},
		{errors.New("other"), CauseFailed},
	} {
		if got := causeOf(c.reason); got != c.want {
			t.Errorf("causeOf(%v) = %s, want %s", c.reason, got, c.want)
		}
	}
}

// The first cause takes the outcome; a stall yields to a context that has
// ended. (The tie rule with the timer is tested with the watchdog, in
// TestWatchdogOneOutcome.)
func TestClaimFirstTakeWins(t *testing.T) {
	c := NewClaim(context.Background())
	if c.Winner() != CauseNone || !c.Take(CauseCancelled) || c.Take(CauseCompleted) || c.Winner() != CauseCancelled {
		t.Fatalf("winner %s, want the first take", c.Winner())
	}
	if c.FinalizeStall() {
		t.Fatal("a stall finalized that never took the outcome")
	}
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(errDisconnected)
	if c := NewClaim(ctx); c.TakeStall(time.Now()) || c.Winner() != CauseNone {
		t.Fatal("the stall took the outcome of a call whose context had ended")
	}
	if c := NewClaim(context.Background()); !c.TakeStall(time.Now()) || !c.FinalizeStall() || c.Take(CauseDeadline) {
		t.Fatal("a final stall was taken over")
	}
}
