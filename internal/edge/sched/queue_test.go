package sched_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Queue: N+M requests against N slots; the M wait and are granted in
// arrival order, one per freed slot.
func TestQueuedRequestsAreGrantedInArrivalOrder(t *testing.T) {
	const n, m = 3, 4
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("n", provider("p", "ollama", n, "m"))
		var running []*sched.Slot
		for i := range n {
			running = append(running, f.acquire(req(fmt.Sprint("run", i), "m")))
		}
		var waiting []*pending
		for i := range m {
			waiting = append(waiting, f.enqueue(req(fmt.Sprint("wait", i), "m")))
		}
		queued(t, waiting...)
		for i, w := range waiting {
			running[0].Release()
			running[0].Release() // idempotent: frees one slot, not two
			running = running[1:]
			synctest.Wait()
			slot := w.granted(t)
			if slot.Waited != 0 {
				t.Errorf("%s waited %s on a clock that did not move", w.id, slot.Waited)
			}
			queued(t, waiting[i+1:]...)
			running = append(running, slot)
		}
		if got := f.s.InFlight(); len(got) != 1 || got[0].InFlight != n || got[0].Capacity != n {
			t.Fatalf("in flight %+v, want %d of %d", got, n, n)
		}
	})
}

// Queue: a request arriving while others wait joins the end of the line
// even if it could run somewhere the waiters cannot; a waiter is passed
// only for a slot it cannot use.
func TestAWaiterIsPassedOnlyForASlotItCannotUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("a", provider("p", "ollama", 1, "m"))
		f.join("b", provider("p", "ollama", 1, "m"))
		onA := f.acquire(sched.Request{Model: "m", Match: onNode("a")})
		onB := f.acquire(sched.Request{Model: "m", Match: onNode("b")})
		first := req("first", "m")
		first.Match = onNode("a")
		w1 := f.enqueue(first)
		w2 := f.enqueue(req("second", "m"))
		w3 := f.enqueue(req("third", "m"))

		onB.Release() // first cannot use b: second, not third, takes it
		synctest.Wait()
		queued(t, w1, w3)
		if got := w2.granted(t).Candidate.NodeID; got != "b" {
			t.Fatalf("second on %s, want b", got)
		}
		onA.Release() // first in line can use a
		synctest.Wait()
		queued(t, w3)
		w1.granted(t)
	})
}

// S5: the queue timeout ends a wait exactly when it passes, with its own
// error, and the request leaves the queue.
func TestQueueTimeoutFiresExactlyAtQueueTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("n", provider("p", "ollama", 1, "m"))
		f.acquire(req("running", "m"))
		r := req("waiting", "m")
		r.QueueTimeout = 5 * time.Second
		w := f.enqueue(r)
		time.Sleep(r.QueueTimeout - time.Nanosecond)
		synctest.Wait()
		queued(t, w)
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if !w.finished() {
			t.Fatal("still waiting at the queue timeout")
		}
		re := wantRefusal(t, w.err, sched.ReasonQueueTimeout)
		if !errors.Is(w.err, sched.ErrQueueTimeout) || !re.Busy() || re.RetryAfter <= 0 || re.Model != "m" {
			t.Errorf("refusal %+v: want errors.Is ErrQueueTimeout, busy, a Retry-After, the model", re)
		}
		if q := f.s.Snapshot(); len(q) != 1 || q[0].Depth != 0 || len(q[0].Waiting) != 0 {
			t.Errorf("queues after the timeout %+v, want the waiter gone", q)
		}
	})
}

// Queue: when every slot is busy and the request may not wait, it is
// refused at once with queue_full and a Retry-After.
func TestFullQueueRefusesAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name          string
		alreadyQueued int
		timeout       time.Duration
		depth         int
	}{
		{"queue at its depth", 2, time.Minute, 2},
		{"no queue timeout", 0, 0, 10},
		{"no queue depth", 0, time.Minute, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFleet(t)
				f.join("n", provider("p", "ollama", 1, "m"))
				f.acquire(req("running", "m"))
				for i := range tc.alreadyQueued {
					f.enqueue(req(fmt.Sprint("waiting", i), "m"))
				}
				start := time.Now()
				_, err := f.s.Acquire(t.Context(), sched.Request{ID: "late", Model: "m", QueueTimeout: tc.timeout, MaxQueueDepth: tc.depth})
				re := wantRefusal(t, err, sched.ReasonQueueFull)
				if !errors.Is(err, sched.ErrQueueFull) || !re.Busy() || re.RetryAfter <= 0 {
					t.Errorf("refusal %+v: want errors.Is ErrQueueFull, busy, a Retry-After", re)
				}
				if waited := time.Since(start); waited != 0 {
					t.Errorf("refused after %s, want at once", waited)
				}
				if d := f.s.Depths()["m"]; d != tc.alreadyQueued {
					t.Errorf("depth %d, want %d", d, tc.alreadyQueued)
				}
			})
		})
	}
}

// R9: a Node that becomes ready mid-queue drains the queue in order, as
// far as its capacity goes; registration alone grants nothing (R1).
func TestANodeJoiningMidQueueDrainsItInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("a", provider("p", "ollama", 1, "m"))
		held := f.acquire(req("running", "m"))
		w1 := f.enqueue(req("w1", "m"))
		w2 := f.enqueue(req("w2", "m"))
		w3 := f.enqueue(req("w3", "m"))

		b := f.reg.Register(connInfo("b", provider("p", "ollama", 2, "m")))
		synctest.Wait()
		queued(t, w1, w2, w3)
		if err := f.reg.MarkReady(b, b.Generation(), nil); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		for _, w := range []*pending{w1, w2} {
			if got := w.granted(t).Candidate.NodeID; got != "b" {
				t.Errorf("%s on %s, want b", w.id, got)
			}
		}
		queued(t, w3)
		held.Release()
		synctest.Wait()
		if got := w3.granted(t).Candidate.NodeID; got != "a" {
			t.Errorf("w3 on %s, want a", got)
		}
	})
}

// R9: a Node that reports more capacity grants waiters at once.
func TestCapacityIncreaseGrantsAWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		c := f.join("n", provider("p", "ollama", 1, "m"))
		f.acquire(req("running", "m"))
		w := f.enqueue(req("w", "m"))
		f.reg.UpdateProviders(c, []*wirepb.Provider{provider("p", "ollama", 2, "m")}, 0)
		synctest.Wait()
		w.granted(t)
	})
}

// R9: a fenced Node's capacity is gone; its queued work keeps waiting
// (the timeout has not passed) and moves to a Node that joins. Slots
// still held on the fenced generation count for nothing.
func TestAFencedNodesQueuedWorkMovesToANodeThatJoins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		a := f.join("a", provider("p", "ollama", 1, "m"))
		held := f.acquire(req("running", "m"))
		w := f.enqueue(req("w", "m"))

		f.reg.Fence(a, quicwire.CloseHeartbeatTimeout, "")
		synctest.Wait()
		queued(t, w)
		_, err := f.s.Acquire(t.Context(), req("late", "m"))
		wantRefusal(t, err, sched.ReasonNoCandidate)
		held.Release() // the slot on the fenced generation frees nothing usable
		synctest.Wait()
		queued(t, w)

		time.Sleep(30 * time.Second)
		f.join("b", provider("p", "ollama", 1, "m"))
		synctest.Wait()
		slot := w.granted(t)
		if slot.Candidate.NodeID != "b" || slot.Waited != 30*time.Second {
			t.Fatalf("granted %+v after %s, want b after 30s", slot.Candidate, slot.Waited)
		}
	})
}

// R9: slots held on a fenced generation do not count against the Node's
// next generation.
func TestASlotOnAFencedGenerationDoesNotCountForTheNext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		old := f.join("n", provider("p", "ollama", 1, "m"))
		held := f.acquire(req("running", "m"))
		cur := f.join("n", provider("p", "ollama", 1, "m")) // supersedes old
		slot := f.acquire(req("next", "m"))
		if slot.Candidate.Generation != cur.Generation() {
			t.Fatalf("slot on generation %d, want %d", slot.Candidate.Generation, cur.Generation())
		}
		want := []sched.LoadView{
			{NodeID: "n", Generation: old.Generation(), Provider: "p", InFlight: 1},
			{NodeID: "n", Generation: cur.Generation(), Provider: "p", Adapter: "ollama", Capacity: 1, InFlight: 1, Candidate: true},
		}
		if got := f.s.InFlight(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("in flight\n%+v\nwant\n%+v", got, want)
		}
		held.Release()
		if got := f.s.InFlight(); len(got) != 1 || got[0].Generation != cur.Generation() || got[0].InFlight != 1 {
			t.Fatalf("in flight after the old slot's release %+v, want only the current generation's", got)
		}
	})
}

// A caller that leaves while queued leaves the queue: the requests behind
// it move up, and the slot it would have had goes to the next in line.
func TestCancelWhileQueuedFreesThePosition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("n", provider("p", "ollama", 1, "m"))
		held := f.acquire(req("running", "m"))
		w1 := f.enqueue(req("w1", "m"))
		w2 := f.enqueue(req("w2", "m"))
		w1.cancel()
		synctest.Wait()
		if !w1.finished() || !errors.Is(w1.err, context.Canceled) {
			t.Fatalf("cancelled waiter: finished %v, err %v; want context.Canceled", w1.finished(), w1.err)
		}
		q := f.s.Snapshot()
		if len(q) != 1 || q[0].Depth != 1 || q[0].Waiting[0].ID != "w2" || q[0].Waiting[0].Position != 1 {
			t.Fatalf("queues %+v, want w2 alone at position 1", q)
		}
		held.Release()
		synctest.Wait()
		w2.granted(t).Release()
		if q := f.s.Snapshot(); len(q) != 0 {
			t.Fatalf("queues %+v after everything ended, want none", q)
		}
	})
}

// A grant that races with the caller leaving is not lost: it passes to
// the next in line.
func TestAGrantRacingACancelIsPassedOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("n", provider("p", "ollama", 1, "m"))
		held := f.acquire(req("running", "m"))
		w1 := f.enqueue(req("w1", "m"))
		w2 := f.enqueue(req("w2", "m"))
		w1.cancel()
		held.Release() // may grant w1 before its goroutine sees the cancel
		synctest.Wait()
		if !errors.Is(w1.err, context.Canceled) {
			t.Fatalf("cancelled waiter: slot %v, err %v; want context.Canceled", w1.slot, w1.err)
		}
		w2.granted(t)
		if got := f.s.InFlight(); got[0].InFlight != 1 {
			t.Fatalf("in flight %+v, want w2's slot alone", got)
		}
	})
}

// The admin view: per model, the depth, the slots held, and each waiter
// with its place in line and how long it has waited.
func TestSnapshotShowsDepthAndPositions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("n", provider("p", "ollama", 1, "m", "other"))
		f.acquire(req("running", "m"))
		start := time.Now()
		f.enqueue(req("m1", "m"))
		time.Sleep(time.Second)
		f.enqueue(req("o1", "other"))
		time.Sleep(time.Second)
		f.enqueue(req("m2", "m"))
		time.Sleep(500 * time.Millisecond)

		want := []sched.QueueView{
			{Model: "m", Depth: 2, InFlight: 1, Waiting: []sched.WaitingView{
				{ID: "m1", Position: 1, EnqueuedAt: start, WaitedMillis: 2500},
				{ID: "m2", Position: 2, EnqueuedAt: start.Add(2 * time.Second), WaitedMillis: 500},
			}},
			{Model: "other", Depth: 1, Waiting: []sched.WaitingView{
				{ID: "o1", Position: 1, EnqueuedAt: start.Add(time.Second), WaitedMillis: 1500},
			}},
		}
		if got := f.s.Snapshot(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("snapshot\n%+v\nwant\n%+v", got, want)
		}
		if got := f.s.Depths(); len(got) != 2 || got["m"] != 2 || got["other"] != 1 {
			t.Fatalf("depths %v, want m:2 other:1", got)
		}
	})
}

// Queue: capacity that appears is offered to the waiters before a request
// that arrives at the same moment, even before Run has seen the change.
func TestANewRequestDoesNotOvertakeWaitersOnNewCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("a", provider("p", "ollama", 1, "m"))
		f.acquire(req("running", "m"))
		w := f.enqueue(req("w", "m"))
		f.join("b", provider("p", "ollama", 1, "m"))
		late := req("late", "m")
		late.QueueTimeout = 0
		_, err := f.s.Acquire(t.Context(), late)
		wantRefusal(t, err, sched.ReasonQueueFull)
		synctest.Wait()
		if got := w.granted(t).Candidate.NodeID; got != "b" {
			t.Fatalf("waiter on %s, want b", got)
		}
	})
}
