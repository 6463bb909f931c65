package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/live"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Run is a normalized run in progress for a client. Read it with Next until
// the terminal event; then (or on any early exit) Close it.
type Run struct {
	ID   string
	Plan Plan

	g      *Gateway
	p      auth.Principal
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   context.CancelFunc // releases the deadline timer
	req    *wirepb.RunRequest
	slot   *sched.Slot
	rs     *nodeserver.RunStream
	first  *wirepb.RunEvent
	done   bool
	// stallRetried: the one retry a stalled run gets was used (recovery).
	stallRetried bool
	admitted     func() // called at the first slot, then nil
	meter        usageMeter
	live         *live.Entry // the status page's view of the run (live.go)
	streaming    bool        // live has seen the first output
}

// StartRun resolves model for principal p, then dispatches req, moving to
// another candidate while the run has produced nothing (a Node lost or
// refusing before the first event). req's ids, provider, target, deadline
// and stall timeout are set here. ctx bounds the whole run; the profile's
// hard deadline is applied on top. admitted, if not nil, is called once, on
// this goroutine, when the request first gets a slot: its queue wait, which
// the queue timeout alone bounds (S5), is over.
func (g *Gateway) StartRun(ctx context.Context, p auth.Principal, model string, req *wirepb.RunRequest, admitted func()) (*Run, error) {
	plan, err := g.Resolve(p, model, "")
	if err != nil {
		return nil, err
	}
	if req.GetCompletion() != nil {
		plan.Needs = CapComplete // a raw completion: not every adapter runs one
	}
	r := &Run{ID: g.NewID("run"), Plan: plan, g: g, p: p, admitted: admitted,
		meter: usageMeter{g: g, model: plan.Model, principal: p.Name}}
	r.ctx, r.cancel = context.WithCancelCause(ctx)
	deadline := time.Now().Add(time.Duration(plan.Profile.Deadline))
	r.ctx, r.stop = context.WithDeadline(r.ctx, deadline)
	r.req = proto.Clone(req).(*wirepb.RunRequest)
	r.req.RunId = r.ID
	r.req.DeadlineUnixMs = deadline.UnixMilli()
	r.req.ResponseStallTimeoutMs = time.Duration(plan.Profile.ResponseStallTimeout).Milliseconds()
	r.live = g.track(ctx, live.Run, r.ID, p, plan)
	if err := r.start(); err != nil {
		r.live.End(startReason(err, context.Cause(ctx), plan.Model))
		r.stop()
		r.cancel(err)
		return nil, err
	}
	return r, nil
}

// start dispatches to candidates until one produces a first event that is
// not a refusal or a loss.
func (r *Run) start() error {
	var tried []sched.Candidate
	var lastErr error
	holdOffs := 0
	for attempt := 0; attempt < MaxAttempts; attempt++ {
		r.live.Queued()
		slot, err := r.g.acquire(r.ctx, r.ID, r.Plan, tried)
		if err != nil {
			if lastErr != nil && errors.Is(err, sched.ErrNoCandidate) {
				return noStreamIsBusy(r.Plan.Model, lastErr) // every candidate tried failed: say why
			}
			return err
		}
		if r.admitted != nil {
			r.admitted()
			r.admitted = nil
		}
		c := slot.Candidate
		req := proto.Clone(r.req).(*wirepb.RunRequest)
		req.Provider, req.Adapter, req.Target = c.Provider, c.Adapter, c.Target
		deadline, _ := r.ctx.Deadline()
		req.SealedLease, req.Binding, err = r.g.seal(r.p, r.Plan, fmt.Sprintf("%s#%d", r.ID, attempt), c, slot.Conn(), deadline)
		if err != nil {
			slot.Release()
			return err // no other credential, no other way (S4)
		}
		r.live.Dispatched(c.NodeID, c.Provider, c.Target)
		rs, err := r.g.srv.Run(r.ctx, c.NodeID, req)
		if err == nil {
			// A Node that turns suspect while the run has produced
			// nothing gives the run up, and it moves on (P4).
			unwatch := slot.Conn().AfterSuspect(func() { rs.Abandon(nodeSuspect(c.NodeID)) })
			var ev *wirepb.RunEvent
			ev, err = rs.Next()
			unwatch()
			if err == nil {
				r.g.countStall(ev.GetStall())
			}
			retry := err == nil && r.retryStall(ev)
			if err == nil && !failoverable(ev) && !retry {
				r.slot, r.rs, r.first = slot, rs, ev
				return nil
			}
			if err == nil {
				err = &RunFailedError{Event: ev}
			}
			rs.Close()
		}
		slot.Release()
		if r.ctx.Err() != nil {
			return context.Cause(r.ctx)
		}
		if busyOnNode(err) && holdOff(r.ctx, holdOffs) {
			holdOffs++
			attempt-- // the same candidates again, not a failover
			continue
		}
		tried = append(tried, c)
		lastErr = err
		reason := reasonOf(err)
		if rs != nil && rs.Abandoned() {
			reason = "node_suspect"
		}
		r.g.failover(r.ID, c, err, reason)
	}
	return noStreamIsBusy(r.Plan.Model, lastErr)
}

// nodeSuspect is why work that waited for its first byte on a Node that
// turned suspect was given up there.
func nodeSuspect(nodeID string) error {
	return fmt.Errorf("node %q turned suspect (not heard from at the transport level) before the first byte; moving the work", nodeID)
}

// noStreamIsBusy reports a dispatch that found no stream free on its
// Node's connection as what it is to a client: every slot busy, a queue
// timeout (429 with Retry-After), not a failure of the Node.
func noStreamIsBusy(model string, err error) error {
	if errors.Is(err, nodeserver.ErrStreamWait) {
		return &sched.RefusalError{Reason: sched.ReasonQueueTimeout, Model: model, RetryAfter: time.Second, Detail: err.Error()}
	}
	return err
}

// failoverable reports whether a first event means "try elsewhere": the
// Node was lost, or refused the run before doing anything.
func failoverable(ev *wirepb.RunEvent) bool {
	switch ev.GetType() {
	case wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED:
		return true
	case wirepb.RunEventType_RUN_EVENT_TYPE_FAILED:
		switch ev.GetFailure().GetKind() {
		case wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED:
			return true
		}
	}
	return false
}

// retryStall reports whether a first event is a stall the run recovers
// from: the Node confirmed the provider call closed (retryable), nothing
// reached the client (it is the first event), and the run has not been
// retried for a stall before. The retry goes to another candidate with the
// same request, stall timeout included (R4).
func (r *Run) retryStall(ev *wirepb.RunEvent) bool {
	if ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED || !ev.GetStall().GetRetryable() || r.stallRetried {
		return false
	}
	r.stallRetried = true
	return true
}

// reasonOf labels a move to another candidate for metrics.
func reasonOf(err error) string {
	var failed *RunFailedError
	if errors.As(err, &failed) && failed.Event.GetType() == wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED {
		return "response_stalled"
	}
	var te *nodeserver.TunnelError
	if errors.As(err, &te) && te.Outcome == wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED {
		return "response_stalled"
	}
	return "before_first_byte"
}

// LivenessHeader names the response header that carries a stall's
// liveness classification (request_stalled, provider_unhealthy,
// health_unknown) when the error is answered before the response started.
const LivenessHeader = "X-IOP-Liveness"

// StallSummary describes a stall observation for a client: Node-owned
// facts only (R5), never payload text.
func StallSummary(o *wirepb.StallObservation) string {
	if o == nil {
		return "no progress within the stall timeout"
	}
	ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
	s := fmt.Sprintf("no progress for %v (stall timeout %v); provider health %s, classification %s",
		ms(o.GetSinceLastProgressMs()), ms(o.GetStallTimeoutMs()), o.GetProviderHealth(), o.GetLivenessClassification())
	if o.GetProviderHealth() == quicwire.HealthUnavailable {
		s += "; the target is out of selection until it answers again"
	}
	return s
}

// countStall counts a stall observation by its classification.
func (g *Gateway) countStall(o *wirepb.StallObservation) {
	if o != nil && g.metrics != nil {
		g.metrics.Stalls.WithLabelValues(o.GetLivenessClassification()).Inc()
	}
}

// RunFailedError is a run that ended before producing anything, on every
// candidate tried; Event is the last terminal.
type RunFailedError struct{ Event *wirepb.RunEvent }

func (e *RunFailedError) Error() string {
	if f := e.Event.GetFailure(); f != nil {
		return e.Event.GetType().String() + ": " + f.GetMessage()
	}
	return e.Event.GetType().String()
}

func (g *Gateway) failover(id string, c sched.Candidate, err error, reason string) {
	g.log.Warn("moving work to another candidate", "id", id, "node", c.NodeID, "provider", c.Provider, "reason", reason, "err", err)
	if g.metrics != nil {
		g.metrics.Failovers.WithLabelValues(reason).Inc()
	}
}

// Node is where the run runs.
func (r *Run) Node() sched.Candidate { return r.slot.Candidate }

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
		r.g.countStall(ev.GetStall())
	}
	r.meter.see(ev)
	r.see(ev)
	if IsTerminal(ev) {
		r.done = true
		r.meter.end(r.slot.Candidate.NodeID, ev.GetType() == wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED)
		r.release()
	}
	return ev, nil
}

// IsTerminal reports whether ev ends its run: exactly one event of every
// run does (R2). Named here once, not as an order of the enum.
func IsTerminal(ev *wirepb.RunEvent) bool {
	switch ev.GetType() {
	case wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
		wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED, wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED,
		wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED, wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED:
		return true
	}
	return false
}

// Cancel ends the run with cause (client gone, idle timeout): the Node is
// told (R10) and Next yields the terminal.
func (r *Run) Cancel(cause error) { r.cancel(cause) }

// Context is the run's context (done when the run is cancelled or its
// deadline passes); Cause tells why.
func (r *Run) Context() context.Context { return r.ctx }

// Close releases everything the run holds. It is safe to call at any time
// and more than once.
func (r *Run) Close() {
	if !r.done {
		r.done = true
		r.rs.Close()
		r.meter.end(r.slot.Candidate.NodeID, false) // what was reported before the client left
		r.live.End(closedReason(context.Cause(r.ctx)))
	}
	r.release()
	r.stop()
	r.cancel(context.Canceled)
}

func (r *Run) release() {
	if r.slot != nil {
		r.slot.Release()
	}
}
