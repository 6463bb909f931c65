package fleet_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/fleet"
)

// clock is a settable clock for a Registry.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

func readyConn(t *testing.T, r *fleet.Registry, id string) *fleet.Conn {
	t.Helper()
	c, _ := register(r, id)
	if err := r.MarkReady(c, c.Generation(), nil); err != nil {
		t.Fatal(err)
	}
	return c
}

func viewOf(t *testing.T, r *fleet.Registry, id string) fleet.NodeView {
	t.Helper()
	for _, v := range r.Snapshot() {
		if v.ID == id {
			return v
		}
	}
	t.Fatalf("node %s not in the snapshot", id)
	return fleet.NodeView{}
}

// P4, issue 26: heard from again is not ready. A suspect Node heard from
// again stays suspect, and out of Ready and Dispatchable, until a
// heartbeat sent at or after the suspicion is answered; an answer to one
// sent before it (on its way before the silence) clears nothing.
func TestASuspectNodeHeardFromAgainIsDispatchableOnlyOnceAHeartbeatAfterTheSilenceIsAnswered(t *testing.T) {
	clk := newClock()
	r := fleet.New(fleet.Options{Now: clk.Now})
	c := readyConn(t, r, "n1")
	before := clk.Now() // a heartbeat sent before the silence
	clk.advance(6 * time.Second)
	r.MarkSuspect(c, 6*time.Second)
	suspectAt := clk.Now()

	clk.advance(10 * time.Second)
	if !r.MarkHeard(c) {
		t.Fatal("MarkHeard on a suspect node reported it not suspect")
	}
	var nd *fleet.NotDispatchableError
	if _, err := r.Dispatchable("n1"); !errors.As(err, &nd) || !nd.Suspect {
		t.Fatalf("heard from again, no heartbeat answered: Dispatchable = %v, want suspect", err)
	}
	if len(r.Ready()) != 0 {
		t.Fatal("heard from again, no heartbeat answered: the node is in Ready")
	}
	if r.Answered(c, before) {
		t.Fatal("an answer to a heartbeat sent before the suspicion ended it")
	}
	if _, ok := c.Suspect(); !ok {
		t.Fatal("an answer to a heartbeat sent before the suspicion ended it")
	}
	if !r.Answered(c, suspectAt) { // the probe sent at the suspicion
		t.Fatal("the answer to the probe did not end the suspicion")
	}
	if got, err := r.Dispatchable("n1"); err != nil || got != c {
		t.Fatalf("after the answer: %v %v, want the same generation dispatchable", got, err)
	}
	if r.Answered(c, clk.Now()) || r.MarkHeard(c) {
		t.Fatal("Answered or MarkHeard on a node no longer suspect reported one")
	}
}

// Issue 26: the admin view of a suspect Node says it is not dispatchable,
// how long it has been silent, and, once its packets arrive again, that it
// was heard from again (and is waiting for a heartbeat's answer).
func TestTheViewOfASuspectNodeSaysNotDispatchableAndHowLongSilent(t *testing.T) {
	clk := newClock()
	r := fleet.New(fleet.Options{Now: clk.Now})
	c := readyConn(t, r, "n1")
	if v := viewOf(t, r, "n1"); !v.Dispatchable || v.Suspect || v.SilentForMillis != nil {
		t.Fatalf("a ready node's view: %+v", v)
	}
	clk.advance(6 * time.Second)
	r.MarkSuspect(c, 6*time.Second)
	clk.advance(4 * time.Second)
	v := viewOf(t, r, "n1")
	if v.Dispatchable || !v.Suspect || v.SilentForMillis == nil || *v.SilentForMillis != 10000 || v.HeardAgainAt != nil {
		t.Fatalf("a suspect node's view: dispatchable %v suspect %v silent_for_ms %v heard_again_at %v; want not dispatchable, suspect, silent 10000 ms, not heard again",
			v.Dispatchable, v.Suspect, v.SilentForMillis, v.HeardAgainAt)
	}
	if v.State != fleet.Ready {
		t.Errorf("a suspect node's state %s, want ready: suspicion is not a fence", v.State)
	}
	heard := clk.advance(2 * time.Second)
	r.MarkHeard(c)
	clk.advance(3 * time.Second)
	v = viewOf(t, r, "n1")
	if v.Dispatchable || !v.Suspect || v.HeardAgainAt == nil || !v.HeardAgainAt.Equal(heard) || *v.SilentForMillis != 12000 {
		t.Fatalf("heard from again: dispatchable %v suspect %v heard_again_at %v silent_for_ms %v; want suspect, heard at %v after 12000 ms of silence",
			v.Dispatchable, v.Suspect, v.HeardAgainAt, *v.SilentForMillis, heard)
	}
	// Silent again before any answer: still suspect, silent anew.
	clk.advance(6 * time.Second)
	r.MarkSuspect(c, 6*time.Second)
	v = viewOf(t, r, "n1")
	if !v.Suspect || v.HeardAgainAt != nil || *v.SilentForMillis != 6000 {
		t.Fatalf("silent again: suspect %v heard_again_at %v silent_for_ms %v; want suspect, silent 6000 ms", v.Suspect, v.HeardAgainAt, *v.SilentForMillis)
	}
}
