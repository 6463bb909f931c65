package gateway

import (
	"net/http"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// RunReader is a run as Relay reads it: events until exactly one terminal.
type RunReader interface {
	Next() (*wirepb.RunEvent, error)
}

// Flush sends what the API wrote of an event to the client, unless the
// run being relayed already has its next event whole: that one is written
// first, and one flush (one write to the client) carries both. Under load,
// events that arrive together leave together; a lone event is never held
// back, since nothing is waited for. Writers call it after each event they
// write on the relaying goroutine; keep-alives and error endings flush
// unconditionally.
func (x *Exchange) Flush(rc *http.ResponseController) error {
	if x.more != nil && x.more() {
		return nil
	}
	return rc.Flush()
}

// RunWriter writes a run's answer in one API's shape. Each write reports
// false when the client could not be written to. An API with no place
// for some kind of event (a text completion has none for reasoning or
// tool calls) writes nothing for it and reports true.
type RunWriter interface {
	// Text and Reasoning relay deltas of the answer and of its thinking.
	Text(s string) bool
	Reasoning(s string) bool
	// ToolCall relays a tool call or a fragment of one (by its index).
	ToolCall(tc *wirepb.ToolCall) bool
	// Usage notes the run's token counts and durations, as they come.
	Usage(u *wirepb.Usage)
	// Complete writes the end of an answer that completed, with the
	// run's done reason.
	Complete(doneReason string) bool
}

// Relay reads run until its terminal and writes it with w, on the
// handler's goroutine: the one relay loop of every API. It returns nil when
// the run completed and w wrote its end; FailClientGone when a write
// failed (the request is stopped, so the run is cancelled); otherwise the
// failure of the run's terminal, explained by the exchange's cause (client
// gone, idle timeout, deadline) when there is one. A run that ends without
// a terminal is a protocol failure.
func (x *Exchange) Relay(run RunReader, w RunWriter) *Failure {
	if r, ok := run.(interface{ Ready() bool }); ok {
		x.more = r.Ready
		defer func() { x.more = nil }()
	}
	for {
		ev, err := run.Next()
		if err != nil {
			ev = &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
				Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROTOCOL, Message: "run ended without a terminal: " + err.Error()}}
		}
		if u := ev.GetUsage(); u != nil {
			w.Usage(u)
		}
		ok := true
		switch t := ev.GetType(); {
		case t == wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED:
			if !w.Complete(ev.GetDoneReason()) {
				return FailClientGone
			}
			return nil
		case IsTerminal(ev):
			return RunFailure(ev, x.Why())
		case t == wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA:
			ok = w.Text(ev.GetText())
		case t == wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA:
			ok = w.Reasoning(ev.GetText())
		case t == wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA:
			ok = w.ToolCall(ev.GetToolCall())
		}
		if !ok {
			x.Stop(ErrClientGone)
			return FailClientGone
		}
	}
}

// Ready reports whether the next event is here already, so that Next
// returns it without waiting (see Exchange.Flush).
func (r *Run) Ready() bool {
	return !r.done && (r.first != nil || r.rs.Ready())
}
