package sched_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	fleet1 "github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// fleet is a registry with a running scheduler over it. Build it inside a
// synctest bubble: the scheduler's Run ends with the test's context.
type fleet struct {
	t   *testing.T
	reg *fleet1.Registry
	s   *sched.Scheduler
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	reg := fleet1.New(fleet1.Options{})
	s := sched.New(reg, sched.Options{})
	go s.Run(t.Context())
	return &fleet{t: t, reg: reg, s: s}
}

// provider is an online provider serving targets.
func provider(name, adapter string, capacity int, targets ...string) *wirepb.Provider {
	p := &wirepb.Provider{Name: name, Adapter: adapter, Capacity: uint32(capacity), State: wirepb.ProviderState_PROVIDER_STATE_ONLINE}
	for _, t := range targets {
		p.Targets = append(p.Targets, &wirepb.Target{Name: t})
	}
	return p
}

// join registers a new generation of Node id and completes its ready
// handshake with providers.
func (f *fleet) join(id string, providers ...*wirepb.Provider) *fleet1.Conn {
	f.t.Helper()
	c := f.reg.Register(fleet1.ConnInfo{NodeID: id, Providers: providers})
	if err := f.reg.MarkReady(c, c.Generation(), providers); err != nil {
		f.t.Fatal(err)
	}
	return c
}

// acquire takes a slot that must be free now.
func (f *fleet) acquire(r sched.Request) *sched.Slot {
	f.t.Helper()
	slot, err := f.s.Acquire(f.t.Context(), r)
	if err != nil {
		f.t.Fatalf("acquire %s: %v", r.ID, err)
	}
	return slot
}

// pending is an Acquire running in its own goroutine.
type pending struct {
	id     string
	done   chan struct{}
	slot   *sched.Slot
	err    error
	cancel context.CancelFunc
}

// enqueue starts an Acquire and returns once it is blocked (queued or
// finished), so requests enqueued one after the other arrive in that order.
func (f *fleet) enqueue(r sched.Request) *pending {
	ctx, cancel := context.WithCancel(f.t.Context())
	p := &pending{id: r.ID, done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(p.done)
		p.slot, p.err = f.s.Acquire(ctx, r)
	}()
	synctest.Wait()
	return p
}

func (p *pending) finished() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// granted returns the slot p was given; it fails unless p got one.
func (p *pending) granted(t *testing.T) *sched.Slot {
	t.Helper()
	if !p.finished() {
		t.Fatalf("%s still waits", p.id)
	}
	if p.err != nil {
		t.Fatalf("%s: %v", p.id, p.err)
	}
	return p.slot
}

// queued fails unless every p still waits.
func queued(t *testing.T, ps ...*pending) {
	t.Helper()
	for _, p := range ps {
		if p.finished() {
			t.Fatalf("%s finished (slot %v, err %v), want it to wait", p.id, p.slot, p.err)
		}
	}
}

// wantRefusal fails unless err is a refusal with reason.
func wantRefusal(t *testing.T, err error, reason string) *sched.RefusalError {
	t.Helper()
	var re *sched.RefusalError
	if !errors.As(err, &re) || re.Reason != reason {
		t.Fatalf("err %v, want a %s refusal", err, reason)
	}
	return re
}

// req is a request for model that may wait up to a minute behind up to
// ten others.
func req(id, model string) sched.Request {
	return sched.Request{ID: id, Model: model, QueueTimeout: time.Minute, MaxQueueDepth: 10}
}

func onNode(id string) func(sched.Candidate) bool {
	return func(c sched.Candidate) bool { return c.NodeID == id }
}

func connInfo(id string, providers ...*wirepb.Provider) fleet1.ConnInfo {
	return fleet1.ConnInfo{NodeID: id, Providers: providers}
}
