package dispatch

import (
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// usageMeter follows what one run or tunnel reports of its tokens, and
// counts it in metrics once, when the work ends: the tokens by model,
// principal and Node, and, for an answer that completed, its pace. Usage is
// cumulative (each report is the accounting so far), so the last report is
// what counts. It is used by the goroutine that reads the work.
type usageMeter struct {
	d                *Dispatcher
	model, principal string

	usage    *wirepb.Usage // the last reported
	firstOut time.Time     // when the first output arrived
	counted  bool
}

// output notes that output arrived now; only the first call matters.
func (u *usageMeter) output() {
	if u.firstOut.IsZero() {
		u.firstOut = time.Now()
	}
}

// see notes a run event: its usage, and whether it is output.
func (u *usageMeter) see(ev *wirepb.RunEvent) {
	if us := ev.GetUsage(); us != nil {
		u.usage = us
	}
	switch ev.GetType() {
	case wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA,
		wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA:
		u.output()
	}
}

// end counts the work's usage on node, once: the tokens whatever the
// outcome (a failed or cancelled answer cost what was reported of it), the
// pace only of an answer that completed.
func (u *usageMeter) end(node string, completed bool) {
	if u.counted || u.d == nil || u.d.metrics == nil {
		return
	}
	u.counted = true
	if u.usage == nil {
		return
	}
	u.d.metrics.CountUsage(u.model, u.principal, node, u.usage.GetPromptTokens(), u.usage.GetCompletionTokens())
	if completed && !u.firstOut.IsZero() {
		u.d.metrics.ObserveRate(u.model, u.usage.GetCompletionTokens(), time.Since(u.firstOut))
	}
}
