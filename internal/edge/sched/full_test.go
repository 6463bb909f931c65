package sched_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Issue 22: a Node's slots are shared by every Edge of the cluster. One it
// refused busy is kept out of the picks (another Node gets the work, or the
// request waits in its queue) until the Node reports a slot free, or for
// sched.FullBackoff: no retry loop against a full Node.
func TestANodeRefusedBusyWaitsForItsStatusOrTheBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		full := provider("p", "ollama", 2, "m")
		conn := f.join("n1", full)
		slot := f.acquire(req("r1", "m"))
		c := slot.Candidate
		f.s.MarkFull(c)
		slot.Release()

		p := f.enqueue(req("r2", "m"))
		queued(t, p)

		// A status update that still says every slot is taken keeps it out.
		busy := provider("p", "ollama", 2, "m")
		busy.InUse = 2
		f.reg.UpdateProviders(conn, []*wirepb.Provider{busy}, 0)
		synctest.Wait()
		queued(t, p)

		// One that says a slot is free lets the waiter in at once.
		free := provider("p", "ollama", 2, "m")
		free.InUse = 1
		f.reg.UpdateProviders(conn, []*wirepb.Provider{free}, 0)
		synctest.Wait()
		s2 := p.granted(t)
		f.s.MarkFull(s2.Candidate)
		s2.Release()

		// Without a status update, the backoff ends the mark.
		p3 := f.enqueue(req("r3", "m"))
		queued(t, p3)
		time.Sleep(sched.FullBackoff)
		synctest.Wait()
		p3.granted(t).Release()
	})
}

// The Node's report of slots in use by every Edge ranks a Node whose slots
// other Edges hold below a free one (the hint; the refusal is the
// guarantee).
func TestSlotsInUseElsewhereRankANodeLower(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		held := provider("p", "ollama", 4, "m")
		held.InUse = 3
		f.join("a", held)
		f.join("b", provider("p", "ollama", 4, "m"))
		for range 3 {
			if got := f.acquire(req("r", "m")).Candidate.NodeID; got != "b" {
				t.Fatalf("picked %s, want b: a's Node says 3 of its 4 slots are in use", got)
			}
		}
	})
}
