package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/internal/shallow"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The one dispatch loop, for runs, tunnels and embedding calls alike:
//
//	acquire a slot among the candidates not tried yet
//	seal the lease for it (S4: a lease that cannot be issued ends the work; no other credential)
//	open the stream and send the work (on a goroutine of its own: see dispatch)
//	wait for the first answer, giving the work up if the Node turns suspect (P4)
//	judge that answer:
//	  it produced something, or ended in a way the client is told  → keep it there
//	  the Node's slots are still busy with a call the Edge let go of → hold off, try the same candidates
//	  the Node refused it busy (its slots taken by another Edge)    → mark it full, acquire again: another candidate or the queue
//	  the Node was lost or refused before doing anything            → move to another candidate
//	  a stall whose provider call the Node confirmed closed         → move, once (the retry keeps R4's timeout)
//
// at most MaxAttempts candidates and maxHoldOffs hold-offs per request, and
// busy refusals for as long as its queue timeout.

// MaxAttempts bounds how many candidates one request tries before its
// first answer.
const MaxAttempts = 3

// maxHoldOffs bounds how often one request waits for a Node whose slots
// are still finishing (busy): about 2.5 s in all.
const maxHoldOffs = 7

// busyWait bounds how long one request may go on being refused busy by
// Nodes whose slots other Edges hold (issue 22) before a refusal counts as
// a failed attempt: its profile's queue timeout, from the first refusal,
// since it is a wait for a slot like the queue's (S5). Each refusal marks
// the provider full until its Node reports a slot free or
// sched.FullBackoff passes, so this is not a hot loop: the request waits
// in its queue in between.
func busyWait(plan *Plan) time.Duration {
	if q := time.Duration(plan.Profile.QueueTimeout); q > 0 {
		return q
	}
	return edgeconfig.DefaultQueueTimeout
}

// Watch is what the caller hears of the work's way to a Node; every field
// may be nil.
type Watch struct {
	// Admitted is called once, on the loop's goroutine, when the work first
	// gets a slot: its queue wait, which the queue timeout alone bounds
	// (S5), is over.
	Admitted func()
	// Live is the status page's entry of the work: the loop tells it when
	// the work waits for a slot and where it was dispatched.
	Live *inflight.Entry
}

// admitted calls Admitted the first time only.
func (w *Watch) admitted() {
	if w.Admitted != nil {
		w.Admitted()
		w.Admitted = nil
	}
}

// attempt is one kind of work as the loop dispatches it. send sends the
// work to one candidate and wait waits for its first answer; the loop then
// either keeps that attempt or drops it and tries again. send goes deep
// (a QUIC stream opened, the request marshalled) and runs on a goroutine
// of its own; wait runs on the loop's, which stays shallow while it waits
// (see dispatch).
type attempt interface {
	// send dispatches the work to c over conn with its sealed lease. An
	// answer with an error is the attempt's: it was not sent (no stream:
	// its end is zero), or it cannot be (its end says why).
	send(ctx context.Context, c *sched.Candidate, conn Conn, lease []byte, binding *wirepb.LeaseBinding) answer
	// wait waits for the first answer of the work sent to c over conn.
	wait(c *sched.Candidate, conn Conn) answer
	// keep makes the open attempt the work's, on slot.
	keep(slot Slot)
	// drop gives the open attempt up: its stream is closed.
	drop()
}

// answer is an attempt's first answer as every kind of work reports it.
type answer struct {
	// err is nil when the work produced something (an event, a response
	// head, vectors) or completed. Otherwise it says why the attempt
	// ended before producing anything: the dispatch's error (no stream
	// was opened: end is zero), a *RunFailedError (a run, an embedding
	// call) or a *nodeserver.TunnelError (a tunnel).
	err error
	// end is that ending, when there was a stream.
	end Ending
	// abandoned: the Node turned suspect before the first answer, and the
	// work was given up there.
	abandoned bool
}

// verdict is what the loop does with an answer.
type verdict int

const (
	keep     verdict = iota // the work stays where it is
	busy                    // hold off, then the same candidates again
	full                    // mark the candidate full, then acquire again
	move                    // another candidate
	moveOnce                // another candidate, and no more stall retries
)

// judge decides what an answer means for the work, given whether the one
// stall retry was used. A stall before anything reached the client, whose
// provider call the Node confirmed closed (retryable), is retried once
// elsewhere; a second one is the client's answer.
func judge(a answer, stallRetried bool) verdict {
	if a.err == nil {
		return keep
	}
	if a.end.Outcome == OutcomeUnknown { // no stream: the Node is not there
		return move
	}
	switch a.end.Outcome {
	case OutcomeDisconnected:
		return move
	case OutcomeStalled:
		if a.end.Stall.GetRetryable() && !stallRetried {
			return moveOnce
		}
	case OutcomeFailed:
		switch a.end.Failure.GetKind() {
		case wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED:
			if a.end.Failure.GetReason() == nodeserver.BusyReason {
				// The Node refused the stream busy before its first byte
				// (quicwire.StreamBusy): its slots are shared with the
				// cluster's other Edges, and they hold them all. Nothing
				// ran; this Edge's count of the Node is behind.
				return full
			}
			// The Edge frees a slot when it reads the work's terminal or
			// cancels it, the Node when the provider call has returned, so
			// for a moment after a cancel the Edge's count is ahead. That is
			// not a reason to leave the candidate (with one candidate it
			// would refuse the request wrongly): wait a moment, try again.
			return busy
		case wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE:
			return move
		}
	}
	return keep
}

// dispatch runs the loop for work w of plan, as id, until an attempt is
// kept (it returns nil) or none can be: the error then says why, for the
// client (a refusal, ErrUnknownModel, ErrUnsupported, a credential that
// cannot be leased, the context's cause, or the last candidate's ending).
// deadline is the work's hard deadline, which bounds its leases.
//
// A request waits for its first byte in w.wait, called from here, for
// minutes in a prefill under load, and its goroutine keeps the stack it
// grew to on the way (P3: ten thousand waiting requests are ten thousand
// such stacks). So the way to an attempt's wait, which goes deep (the
// scheduler, the lease's seal, a QUIC stream opened and the request
// marshalled into it), runs on a goroutine of its own (shallow.Call,
// begun.run), and what happens after an attempt is a function of its own:
// this frame holds little more than the loop's state.
func (d *Dispatcher) dispatch(ctx context.Context, id string, plan *Plan, deadline time.Time, watch *Watch, w attempt) error {
	l := d.newLoop(plan)
	for n := 0; n < MaxAttempts; n++ {
		b := begun{d: d, ctx: ctx, id: id, plan: plan, deadline: deadline, watch: watch, w: w, l: l, n: n}
		shallow.Call(b.run)
		if b.err != nil {
			return b.err
		}
		a := b.a
		if a.err == nil {
			a = w.wait(&l.c, b.slot.Conn())
		}
		switch next, err := d.after(ctx, id, plan, l, w, b.slot, a); next {
		case kept:
			return nil
		case ended:
			return err
		case again:
			n-- // not a failover: the same or the queue's next candidate
		}
	}
	return noStreamIsBusy(plan.Model, l.lastErr)
}

// begun is the n-th attempt of the loop on its way to its wait: a slot
// acquired, a lease sealed, the work sent. A request queued for a slot
// waits in run, on the helper's goroutine, with the request's own waiting
// for it. It ends with a slot and the attempt's answer, when the work went
// or failed on its way; with err when the work ends without one (the slot
// then released).
type begun struct {
	d        *Dispatcher
	ctx      context.Context
	id       string
	plan     *Plan
	deadline time.Time
	watch    *Watch
	w        attempt
	l        *loop
	n        int

	slot Slot
	a    answer
	err  error
}

func (b *begun) run() {
	d, l := b.d, b.l
	b.watch.Live.Queued()
	slot, err := d.acquire(b.ctx, b.id, b.plan, l.tried, l.last)
	if err != nil {
		if l.lastErr != nil && errors.Is(err, sched.ErrNoCandidate) {
			err = noStreamIsBusy(b.plan.Model, l.lastErr) // every candidate tried failed: say why
		}
		b.err = err
		return
	}
	b.watch.admitted()
	l.c = slot.Candidate()
	lease, binding, err := d.seal(b.plan, b.id, b.n, &l.c, slot.Conn(), b.deadline)
	if err != nil {
		slot.Release()
		b.err = err // no other credential, no other way (S4)
		return
	}
	b.watch.Live.Dispatched(l.c.NodeID, l.c.Provider, l.c.Target)
	b.slot, b.a = slot, b.w.send(b.ctx, &l.c, slot.Conn(), lease, binding)
}

// loop is what the dispatch loop carries from one attempt to the next.
type loop struct {
	tried        []sched.Candidate // the candidates that failed the work
	lastErr      error             // how the last of them failed
	stallRetried bool
	holdOffs     int
	busySince    time.Time // the first busy refusal
	session      sessionID
	last         *sched.Candidate // where the session's last turn ran
	c            sched.Candidate  // the candidate of the attempt in hand
}

func (d *Dispatcher) newLoop(plan *Plan) *loop {
	l := &loop{}
	if plan.Session != "" {
		l.session = sessionOf(plan.Principal.Name, plan.Session, plan.Model)
		l.last, _ = d.sessions.last(l.session)
	}
	return l
}

// step is what the loop does after an attempt.
type step int

const (
	kept  step = iota // the attempt is the work's: done
	ended             // the work ends with an error
	again             // acquire again, without counting an attempt
	moved             // acquire again, elsewhere: a failover
)

// after judges attempt a of the work on l.c, on slot, and keeps it or
// gives it up.
func (d *Dispatcher) after(ctx context.Context, id string, plan *Plan, l *loop, w attempt, slot Slot, a answer) (step, error) {
	c := l.c
	d.countStall(a.end.Stall)
	v := judge(a, l.stallRetried)
	if v == keep && (a.err == nil || ctx.Err() == nil) {
		w.keep(slot)
		if plan.Session != "" {
			d.sessionTurn(l.session, plan, c, l.last, l.tried)
		}
		return kept, nil
	}
	w.drop()
	if v == full && l.busySince.IsZero() {
		l.busySince = time.Now()
	}
	waitBusy := v == full && time.Since(l.busySince) < busyWait(plan)
	if waitBusy {
		// Before the release, which would hand the slot on.
		d.slots.MarkFull(c)
	}
	slot.Release()
	if ctx.Err() != nil {
		return ended, context.Cause(ctx)
	}
	if waitBusy {
		d.busyRefused(id, c)
		return again, nil // the queue decides where it goes next
	}
	if v == busy && holdOff(ctx, l.holdOffs) {
		l.holdOffs++
		return again, nil // the same candidates again
	}
	l.stallRetried = l.stallRetried || v == moveOnce
	l.tried = append(l.tried, c)
	l.lastErr = a.err
	reason := "before_first_byte"
	switch {
	case a.abandoned:
		reason = "node_suspect"
	case a.end.Outcome == OutcomeStalled:
		reason = "response_stalled"
	}
	d.failover(id, c, a.err, reason)
	return moved, nil
}

// sessionTurn records that a turn of plan's session runs on c: where the
// next turn prefers, and how this one went, given last, where the one
// before ran, and tried, the candidates that failed it first.
func (d *Dispatcher) sessionTurn(id sessionID, plan *Plan, c sched.Candidate, last *sched.Candidate, tried []sched.Candidate) {
	at := func(o sched.Candidate) bool {
		return o.NodeID == last.NodeID && o.Provider == last.Provider && o.Target == last.Target
	}
	outcome := TurnNew
	switch {
	case last == nil:
	case at(c):
		outcome = TurnStuck
	case slices.ContainsFunc(tried, at):
		outcome = TurnMovedFailover
	case d.slots.Any(func(o sched.Candidate) bool { return at(o) && plan.Match(o) }):
		outcome = TurnMovedBusy
	default:
		outcome = TurnMovedGone
	}
	d.sessions.ran(id, c, outcome)
	if d.metrics != nil {
		d.metrics.SessionTurns.WithLabelValues(outcome).Inc()
	}
}

// Sessions is what the session table holds and has seen, for the status
// page.
func (d *Dispatcher) Sessions() SessionStats { return d.sessions.stats() }

// watchSuspect gives the attempt's stream up if conn's Node turns suspect
// before stop is called (P4).
func watchSuspect(conn Conn, nodeID string, s Stream) (stop func() bool) {
	return conn.AfterSuspect(func() {
		s.Abandon(fmt.Errorf("node %q turned suspect (not heard from at the transport level) before the first byte; moving the work", nodeID))
	})
}

// holdOff waits before the n-th retry of a candidate that was busy on its
// Node, 20 ms doubling each time; it reports false when ctx ended first or
// n is past maxHoldOffs.
func holdOff(ctx context.Context, n int) bool {
	if n >= maxHoldOffs {
		return false
	}
	t := time.NewTimer(20 * time.Millisecond << n)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
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

// busyRefused logs a Node's busy refusal of work.
func (d *Dispatcher) busyRefused(id string, c sched.Candidate) {
	d.log.Info("node refused work busy (its slots are taken by other edges); marked full, acquiring again", "id", id, "node", c.NodeID, "provider", c.Provider)
}

// failover logs and counts a move to another candidate.
func (d *Dispatcher) failover(id string, c sched.Candidate, err error, reason string) {
	d.log.Warn("moving work to another candidate", "id", id, "node", c.NodeID, "provider", c.Provider, "reason", reason, "err", err)
	if d.metrics != nil {
		d.metrics.Failovers.WithLabelValues(reason).Inc()
	}
}

// countStall counts a stall observation by its classification.
func (d *Dispatcher) countStall(o *wirepb.StallObservation) {
	if o != nil && d.metrics != nil {
		d.metrics.Stalls.WithLabelValues(o.GetLivenessClassification()).Inc()
	}
}
