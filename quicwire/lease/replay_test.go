package lease_test

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iop-dev/iop/quicwire/lease"
)

// An opened lease's id is kept until its expiry plus the skew, then
// forgotten: the cache does not grow with leases that cannot open anyway.
func TestReplayCacheForgetsLeasesOnceExpired(t *testing.T) {
	clk := newClock(t0)
	o := newOpener(clk)
	short := claims("short")
	short.ExpiresAt = t0.Add(10 * time.Second)
	long := claims("long")
	long.ExpiresAt = t0.Add(time.Minute)
	sealedShort := issue(t, short)
	for _, sealed := range [][]byte{sealedShort, issue(t, long)} {
		if _, err := o.Open(sealed, binding()); err != nil {
			t.Fatal(err)
		}
	}
	// At expiry plus skew the short lease is still remembered (it could
	// still open), a millisecond later it is forgotten, as it cannot.
	clk.Set(short.ExpiresAt.Add(lease.DefaultSkew))
	_, err := o.Open(sealedShort, binding())
	wantRejected(t, err, lease.Replayed)
	if n := o.Len(); n != 2 {
		t.Fatalf("%d ids at the boundary, want 2", n)
	}
	clk.Set(short.ExpiresAt.Add(lease.DefaultSkew + time.Millisecond))
	_, err = o.Open(sealedShort, binding())
	wantRejected(t, err, lease.Expired)
	if n := o.Len(); n != 1 {
		t.Fatalf("%d ids after the short lease expired, want 1", n)
	}
	clk.Set(t0.Add(time.Hour))
	_, err = o.Open(sealedShort, binding())
	wantRejected(t, err, lease.Expired)
	if n := o.Len(); n != 0 {
		t.Fatalf("%d ids after both expired, want 0", n)
	}
}

// A clock that steps backwards after an id was forgotten must not let
// that lease open again.
func TestReplayCacheSurvivesAClockSteppingBack(t *testing.T) {
	clk := newClock(t0)
	o := newOpener(clk)
	sealed := issue(t, claims("lease-1"))
	if _, err := o.Open(sealed, binding()); err != nil {
		t.Fatal(err)
	}
	clk.Set(t0.Add(time.Hour)) // forgets lease-1
	later := claims("later")
	later.IssuedAt, later.ExpiresAt = t0.Add(time.Hour), t0.Add(time.Hour+time.Minute)
	if _, err := o.Open(issue(t, later), binding()); err != nil {
		t.Fatal(err)
	}
	if n := o.Len(); n != 1 {
		t.Fatalf("%d ids, want 1", n)
	}
	clk.Set(t0.Add(time.Second)) // the wall clock steps back
	_, err := o.Open(sealed, binding())
	wantRejected(t, err, lease.Expired)
}

// A full cache refuses new leases rather than evict a live id, and takes
// them again once ids expire. The refused lease is not burned.
func TestFullReplayCacheRefusesRatherThanEvicts(t *testing.T) {
	clk := newClock(t0)
	o := lease.NewOpener(lease.OpenerConfig{Key: &node.priv, EdgeKey: edgeKey.Public().(ed25519.PublicKey),
		Now: clk.Now, MaxReplay: 2})
	first := claims("first")
	first.ExpiresAt = t0.Add(10 * time.Second)
	sealedFirst := issue(t, first)
	for _, sealed := range [][]byte{sealedFirst, issue(t, claims("second"))} {
		if _, err := o.Open(sealed, binding()); err != nil {
			t.Fatal(err)
		}
	}
	third := issue(t, claims("third"))
	_, err := o.Open(third, binding())
	if !errors.Is(err, lease.ErrReplayCacheFull) || errors.Is(err, lease.ErrRejected) {
		t.Fatalf("full cache: %v, want ErrReplayCacheFull and not ErrRejected", err)
	}
	// Both live ids are still there: no replay.
	for _, sealed := range [][]byte{sealedFirst, issue(t, claims("second"))} {
		_, err := o.Open(sealed, binding())
		wantRejected(t, err, lease.Replayed)
	}
	clk.Set(first.ExpiresAt.Add(lease.DefaultSkew + time.Millisecond))
	if _, err := o.Open(third, binding()); err != nil {
		t.Fatalf("after an id expired: %v", err)
	}
}

// The replay check and the record are one step: of 100 concurrent opens
// of one lease exactly one succeeds, the others are refused as replayed.
func TestConcurrentOpensOfOneLeaseExactlyOneSucceeds(t *testing.T) {
	o := newOpener(newClock(t0))
	sealed := issue(t, claims("lease-1"))
	var opened, replayed atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 100 {
		wg.Go(func() {
			<-start
			l, err := o.Open(sealed, binding())
			if err == nil {
				opened.Add(1)
				l.Wipe()
				return
			}
			if r, _ := lease.ReasonOf(err); r == lease.Replayed {
				replayed.Add(1)
			} else {
				t.Errorf("Open: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	if opened.Load() != 1 || replayed.Load() != 99 {
		t.Fatalf("%d opened, %d replayed; want 1 and 99", opened.Load(), replayed.Load())
	}
}

// Distinct leases open concurrently with Apply and SetEdgeKey going on.
func TestOpenerIsSafeForConcurrentUse(t *testing.T) {
	o := newOpener(newClock(t0))
	const n = 50
	sealed := make([][]byte, n)
	for i := range sealed {
		sealed[i] = issue(t, claims(fmt.Sprintf("lease-%d", i)))
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, err := o.Open(sealed[i], binding()); err != nil {
				t.Errorf("lease %d: %v", i, err)
			}
		})
	}
	wg.Go(func() {
		for range n {
			o.Apply(nil)
			o.SetEdgeKey(edgeKey.Public().(ed25519.PublicKey))
			_ = o.Len()
		}
	})
	wg.Wait()
	if got := o.Len(); got != n {
		t.Fatalf("%d ids, want %d", got, n)
	}
}
