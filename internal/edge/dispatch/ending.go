package dispatch

import (
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Outcome is how work that did not complete ended, the same for a run's
// terminal event, an embedding call's and a tunnel's terminal: the wire
// has two enums for one idea (RunEventType, TunnelOutcome).
type Outcome int

// Outcomes of work that did not complete.
const (
	OutcomeUnknown      Outcome = iota // no terminal: the work was never dispatched
	OutcomeFailed                      // the Node or provider failed it; Failure says how
	OutcomeCancelled                   // cancelled (R10)
	OutcomeStalled                     // the stall watchdog ended it (R5); Stall says what the Node saw
	OutcomeDeadline                    // the hard deadline passed (S5)
	OutcomeDisconnected                // the Node was lost (R9), or given up as suspect (P4)
)

// Ending is how work ended without completing: its outcome, the failure
// it carries, the Node's stall observation, and the Edge's own
// explanation when the failure has no message (a tunnel the Edge ended
// itself). The front end renders it (frontend.EndingFailure).
type Ending struct {
	Outcome Outcome
	Failure *wirepb.Failure
	Stall   *wirepb.StallObservation
	Local   string
}

// RunEnding is the ending of a run or an embedding call whose terminal
// event is ev (not COMPLETED).
func RunEnding(ev *wirepb.RunEvent) Ending {
	e := Ending{Outcome: OutcomeFailed, Failure: ev.GetFailure(), Stall: ev.GetStall()}
	switch ev.GetType() {
	case wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED:
		e.Outcome = OutcomeCancelled
	case wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED:
		e.Outcome = OutcomeStalled
	case wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED:
		e.Outcome = OutcomeDeadline
	case wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED:
		e.Outcome = OutcomeDisconnected
	}
	return e
}

// TunnelEnding is the ending of a tunnel that did not complete.
func TunnelEnding(te *nodeserver.TunnelError) Ending {
	e := Ending{Outcome: OutcomeFailed, Failure: te.Failure, Stall: te.Stall}
	if te.Err != nil {
		e.Local = te.Err.Error()
	}
	switch te.Outcome {
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED:
		e.Outcome = OutcomeCancelled
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED:
		e.Outcome = OutcomeStalled
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_DEADLINE_EXCEEDED:
		e.Outcome = OutcomeDeadline
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED:
		e.Outcome = OutcomeDisconnected
	}
	return e
}

// RunFailedError is work that ended before producing anything on every
// candidate tried; Event is the last terminal.
type RunFailedError struct{ Event *wirepb.RunEvent }

func (e *RunFailedError) Error() string {
	if f := e.Event.GetFailure(); f != nil {
		return e.Event.GetType().String() + ": " + f.GetMessage()
	}
	return e.Event.GetType().String()
}
