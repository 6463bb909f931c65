package sched_test

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	fleet1 "github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// P4: a suspect Node gets no new work: a new request goes to the other
// Node, and a request queued behind the suspect Node's busy slots is
// re-evaluated at once. Heard from again, the Node is a candidate again at
// once, with no new generation.
func TestASuspectNodeGetsNoNewWorkUntilHeardFromAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		n1 := f.join("n1", provider("p", "ollama", 1, "m"))
		busy := f.acquire(req("r0", "m")) // n1's only slot
		waiter := f.enqueue(req("r1", "m"))
		queued(t, waiter)

		f.reg.MarkSuspect(n1, 6*time.Second)
		synctest.Wait()
		queued(t, waiter) // no other Node yet: it keeps its place
		if _, err := f.s.Acquire(t.Context(), sched.Request{ID: "r2", Model: "m"}); err == nil {
			t.Fatal("a request was granted a slot on a suspect Node")
		} else {
			wantRefusal(t, err, sched.ReasonNoCandidate)
		}

		f.join("n2", provider("p", "ollama", 1, "m"))
		synctest.Wait()
		if got := waiter.granted(t).Candidate.NodeID; got != "n2" {
			t.Fatalf("the waiter went to %s, want n2", got)
		}

		// n1's slot frees while it is suspect: it is not handed out.
		busy.Release()
		next := f.enqueue(req("r3", "m"))
		queued(t, next)
		f.reg.ClearSuspect(n1)
		synctest.Wait()
		slot := next.granted(t)
		if slot.Candidate.NodeID != "n1" || slot.Candidate.Generation != n1.Generation() {
			t.Fatalf("after n1 was heard from again the waiter got %+v, want n1 generation %d", slot.Candidate, n1.Generation())
		}
	})
}

// Issue 10 item 4: a Node's slots are bounded by the streams its
// connection accepts. A Node that declares its limit (capacity plus
// headroom) gets every slot its capacity offers; one that declares none (an
// older Node: 256 streams) gets no more than fit, and the excess waits in
// the queue, visible in its depth and bounded by the queue timeout, instead
// of blocking inside a stream open.
func TestSlotsNeverExceedTheStreamsANodeAccepts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		const capacity = 300
		join := func(id string, maxStreams int) {
			p := []*wirepb.Provider{provider("p", "ollama", capacity, "m-"+id)}
			c := f.reg.Register(fleet1.ConnInfo{NodeID: id, Providers: p, MaxStreams: maxStreams})
			if err := f.reg.MarkReady(c, c.Generation(), p); err != nil {
				t.Fatal(err)
			}
		}
		join("declared", quicwire.DispatchedStreams(capacity))
		join("legacy", 0)

		for i := range capacity {
			f.acquire(req(fmt.Sprintf("d%d", i), "m-declared"))
		}
		legacySlots := quicwire.LegacyDispatchedStreams - quicwire.StreamHeadroom
		for i := range legacySlots {
			f.acquire(req(fmt.Sprintf("l%d", i), "m-legacy"))
		}
		r := req("l-over", "m-legacy")
		r.QueueTimeout = 2 * time.Second
		over := f.enqueue(r)
		queued(t, over)
		if q := f.s.Snapshot(); len(q) != 2 || q[1].Model != "m-legacy" || q[1].Depth != 1 || q[1].InFlight != legacySlots {
			t.Fatalf("queue view %+v, want m-legacy with depth 1 and %d in flight", q, legacySlots)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if !over.finished() {
			t.Fatal("the request beyond the stream limit still waits after its queue timeout")
		}
		wantRefusal(t, over.err, sched.ReasonQueueTimeout)
	})
}
