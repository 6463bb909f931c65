package transport_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/transport"
)

// R7: the transport session (one per connection) owns a monotonic
// health_observation_seq. A new connection starts at 0, so its first
// finalized observation is 1; concurrent observations get unique,
// increasing values.

func TestNewSessionStartsHealthObservationSeqAtZero(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	s := transport.NewSession("node-a", 7, at)
	if s.NodeID() != "node-a" || s.Generation() != 7 || !s.ConnectedAt().Equal(at) {
		t.Fatalf("session = %q gen %d at %v, want node-a gen 7 at %v", s.NodeID(), s.Generation(), s.ConnectedAt(), at)
	}
	if got := s.HealthObservationSeq(); got != 0 {
		t.Fatalf("HealthObservationSeq() of a new session = %d, want 0 (R7)", got)
	}
	if got := s.NextHealthObservationSeq(); got != 1 {
		t.Fatalf("first NextHealthObservationSeq() = %d, want 1 (R7)", got)
	}
	if got := s.HealthObservationSeq(); got != 1 {
		t.Fatalf("HealthObservationSeq() after one observation = %d, want 1", got)
	}
}

// R7: concurrent observations (runs and tunnels on one connection) draw
// unique values, and together they leave no gap.
func TestConcurrentHealthObservationSeqsAreUniqueAndGapFree(t *testing.T) {
	const n = 1000
	s := transport.NewSession("node-a", 1, time.Now())
	got := make([]uint64, n)
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start // the barrier: all goroutines race for the source at once
			got[i] = s.NextHealthObservationSeq()
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()

	slices.Sort(got)
	for i, v := range got {
		if v != uint64(i+1) {
			t.Fatalf("sorted values[%d] = %d, want %d: the values are not exactly {1..%d}", i, v, i+1, n)
		}
	}
	if last := s.HealthObservationSeq(); last != n {
		t.Fatalf("HealthObservationSeq() after %d observations = %d", n, last)
	}
}

// R7: a goroutine that observes several times sees its own values strictly
// increase, however the others interleave.
func TestHealthObservationSeqIncreasesWithinEachGoroutine(t *testing.T) {
	const goroutines, each = 64, 50
	s := transport.NewSession("node-a", 1, time.Now())
	seen := make([][]uint64, goroutines)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range each {
				seen[g] = append(seen[g], s.NextHealthObservationSeq())
			}
		}()
	}
	close(start)
	wg.Wait()

	var all []uint64
	for g, vals := range seen {
		for i := 1; i < len(vals); i++ {
			if vals[i] <= vals[i-1] {
				t.Fatalf("goroutine %d took %d after %d: not strictly increasing", g, vals[i], vals[i-1])
			}
		}
		all = append(all, vals...)
	}
	slices.Sort(all)
	if len(slices.Compact(all)) != goroutines*each {
		t.Fatal("two observations got the same value")
	}
	if last := s.HealthObservationSeq(); last != goroutines*each {
		t.Fatalf("HealthObservationSeq() = %d, want %d", last, goroutines*each)
	}
}

// R7, R9: a reconnect is a new connection and a new Session; its sequence
// starts again, and the old session's value is untouched.
func TestNewConnectionRestartsHealthObservationSeq(t *testing.T) {
	old := transport.NewSession("node-a", 1, time.Now())
	for range 5 {
		old.NextHealthObservationSeq()
	}
	next := transport.NewSession("node-a", 2, time.Now())
	if got := next.HealthObservationSeq(); got != 0 {
		t.Fatalf("new connection's HealthObservationSeq() = %d, want 0", got)
	}
	if got := next.NextHealthObservationSeq(); got != 1 {
		t.Fatalf("new connection's first observation = %d, want 1", got)
	}
	if got := old.HealthObservationSeq(); got != 5 {
		t.Fatalf("old connection's HealthObservationSeq() = %d, want 5", got)
	}
}
