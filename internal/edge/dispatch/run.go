package dispatch

import (
	"context"
	"io"

	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Run is a normalized run in progress for a client (R2). Read it with Next
// until the terminal event; then (or on any early exit) Close it. Next,
// Ready and Close are for the goroutine that relays the run; Cancel and
// Context are safe from any goroutine.
type Run struct {
	work
	req   *wirepb.RunRequest
	slot  Slot
	rs    RunStream
	first *wirepb.RunEvent // the first event, read by the loop, until Next returns it
	done  bool
}

// StartRun dispatches req under plan through the loop (loop.go): it
// returns once the run has a first event that keeps it on a candidate, or
// with why none could. StartRun takes req: its ids, provider, target,
// lease, deadline and stall timeout are set here, on req itself, for each
// candidate tried (a request may be tens of MiB: it is never copied), and
// the caller must not change it while the run lives. ctx bounds the whole run; the profile's hard
// deadline applies on top. A raw completion (req.completion) goes only to
// adapters that complete, a count of tokens (req.count_tokens) only to
// adapters that tokenize.
func (d *Dispatcher) StartRun(ctx context.Context, plan *Plan, req *wirepb.RunRequest, watch Watch) (*Run, error) {
	r := d.newRun(ctx, plan, req, watch.Live)
	if err := d.dispatch(r.ctx, r.id, &r.plan, r.deadline, &watch, r); err != nil {
		r.stop()
		r.cancel(err)
		return nil, err
	}
	return r, nil
}

// newRun is StartRun's run before its dispatch: a function of its own, as
// the dispatch loop says why.
func (d *Dispatcher) newRun(ctx context.Context, plan *Plan, req *wirepb.RunRequest, live *inflight.Entry) *Run {
	r := &Run{}
	r.start(ctx, d, "run", plan, live)
	switch {
	case req.GetCountTokens():
		r.plan.Needs = CapCountTokens
	case req.GetCompletion() != nil:
		r.plan.Needs = CapComplete
	}
	r.req = req
	r.req.RunId = r.id
	r.req.DeadlineUnixMs = r.deadline.UnixMilli()
	r.req.ResponseStallTimeoutMs = plan.stallTimeoutMs()
	return r
}

// send is one attempt of the loop: the run's request to c.
func (r *Run) send(ctx context.Context, c *sched.Candidate, conn Conn, lease []byte, binding *wirepb.LeaseBinding) answer {
	req := r.req // the attempt before this one was dropped: its stream no longer reads it
	req.Provider, req.Adapter, req.Target = c.Provider, c.Adapter, c.Target
	req.SealedLease, req.Binding = lease, binding
	rs, err := r.d.nodes.Run(ctx, c.NodeID, req)
	if err != nil {
		return answer{err: err}
	}
	r.rs = rs
	return answer{}
}

// wait waits for the first event of the run sent to c.
func (r *Run) wait(c *sched.Candidate, conn Conn) answer {
	stop := watchSuspect(conn, c.NodeID, r.rs)
	ev, err := r.rs.Next()
	stop()
	if err != nil { // a stream yields its terminal before any error
		ev = &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROTOCOL, Message: "run ended without a terminal: " + err.Error()}}
	}
	r.first = ev
	a := answer{abandoned: r.rs.Abandoned()}
	if t := ev.GetType(); t.IsTerminal() && t != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
		a.err, a.end = &RunFailedError{Event: ev}, RunEnding(ev)
	}
	return a
}

func (r *Run) keep(slot Slot) { r.slot = slot }

func (r *Run) drop() {
	if r.rs != nil {
		r.rs.Close()
	}
	r.rs, r.first = nil, nil
}

// ID names the run, for logs and the ids of answers.
func (r *Run) ID() string { return r.id }

// Node is where the run runs.
func (r *Run) Node() sched.Candidate { return r.slot.Candidate() }

// Next returns the next event; the last is the terminal, after which Next
// returns io.EOF.
func (r *Run) Next() (*wirepb.RunEvent, error) {
	if r.done {
		return nil, io.EOF
	}
	ev := r.first
	r.first = nil
	if ev == nil {
		var err error
		if ev, err = r.rs.Next(); err != nil {
			return nil, err
		}
		r.d.countStall(ev.GetStall())
	}
	r.meter.see(ev)
	r.see(ev)
	if ev.GetType().IsTerminal() {
		r.done = true
		r.meter.end(r.slot.Candidate().NodeID, ev.GetType() == wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED)
		r.slot.Release()
	}
	return ev, nil
}

// Ready reports whether the next event is here already, so that Next
// returns it without waiting: a relay then writes it before it flushes.
func (r *Run) Ready() bool { return !r.done && (r.first != nil || r.rs.Ready()) }

// see tells the status page about one event: its usage, a token.
func (r *Run) see(ev *wirepb.RunEvent) {
	if r.live == nil {
		return
	}
	if u := ev.GetUsage(); u != nil {
		r.live.Usage(u.GetPromptTokens(), u.GetCompletionTokens())
	}
	if isOutput(ev) {
		if !r.streaming {
			r.streaming = true
			r.live.First()
		}
		r.live.Add(1)
	}
}

// isOutput reports whether ev is output the client sees: a token.
func isOutput(ev *wirepb.RunEvent) bool {
	switch ev.GetType() {
	case wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA,
		wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA:
		return true
	}
	return false
}

// Cancel ends the run with cause (client gone, idle timeout): the Node is
// told (R10) and Next yields the terminal.
func (r *Run) Cancel(cause error) { r.cancel(cause) }

// Context is the run's context (done when the run is cancelled or its
// deadline passes); its cause tells why.
func (r *Run) Context() context.Context { return r.ctx }

// Close releases everything the run holds. It is safe to call at any time
// and more than once.
func (r *Run) Close() {
	if !r.done {
		r.done = true
		r.rs.Close()
		r.meter.end(r.slot.Candidate().NodeID, false) // what was reported before the client left
		r.slot.Release()
	}
	r.stop()
	r.cancel(context.Canceled)
}
