package fleet_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/quicwire"
)

// closer is a Link that records how it was closed.
type closer struct {
	mu    sync.Mutex
	codes []quicwire.CloseCode
}

func (c *closer) Close(code quicwire.CloseCode, _ string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.codes = append(c.codes, code)
}

func (c *closer) RTT() (time.Duration, time.Time) { return 0, time.Time{} }

func (c *closer) OpenStream(context.Context, time.Duration) (*quic.Stream, error) {
	return nil, errors.New("closer opens no streams")
}

func register(r *fleet.Registry, id string) (*fleet.Conn, *closer) {
	cl := new(closer)
	return r.Register(fleet.ConnInfo{NodeID: id, Link: cl}), cl
}

// R1: only the current generation, after the ready handshake, is
// dispatchable.
func TestOnlyACurrentReadyGenerationIsDispatchable(t *testing.T) {
	r := fleet.New(fleet.Options{})
	if _, err := r.Dispatchable("n1"); !errors.Is(err, fleet.ErrNotDispatchable) {
		t.Fatalf("unknown node: %v", err)
	}
	c, _ := register(r, "n1")
	var nd *fleet.NotDispatchableError
	if _, err := r.Dispatchable("n1"); !errors.As(err, &nd) || nd.State != fleet.Registering {
		t.Fatalf("registering node: %v", err)
	}
	if err := r.MarkReady(c, c.Generation()+1, nil); err == nil {
		t.Fatal("ready for another generation accepted")
	}
	if err := r.MarkReady(c, c.Generation(), nil); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Dispatchable("n1"); err != nil || got != c {
		t.Fatalf("ready node: %v %v", got, err)
	}
	if err := r.MarkReady(c, c.Generation(), nil); err == nil {
		t.Fatal("a repeated ready handshake was accepted")
	}
	r.MarkDraining(c)
	if _, err := r.Dispatchable("n1"); !errors.As(err, &nd) || nd.State != fleet.Draining {
		t.Fatalf("draining node: %v", err)
	}
}

// R9: each connection of a Node is a new generation; the new one fences
// the old with superseded, and the old can no longer become ready.
func TestNewGenerationSupersedesTheOld(t *testing.T) {
	r := fleet.New(fleet.Options{GenerationBase: 1000})
	old, oldCloser := register(r, "n1")
	if old.Generation() != 1001 {
		t.Fatalf("first generation %d, want 1001 (above the base)", old.Generation())
	}
	r.MarkReady(old, old.Generation(), nil)
	cur, _ := register(r, "n1")
	if cur.Generation() != old.Generation()+1 {
		t.Fatalf("generation %d, want %d", cur.Generation(), old.Generation()+1)
	}
	select {
	case <-old.Fenced():
	default:
		t.Fatal("old generation not fenced")
	}
	if code, _, ok := old.FenceReason(); !ok || code != quicwire.CloseSuperseded {
		t.Errorf("old fence reason %v %v, want superseded", code, ok)
	}
	if len(oldCloser.codes) != 1 || oldCloser.codes[0] != quicwire.CloseSuperseded {
		t.Errorf("old connection closed with %v, want [superseded]", oldCloser.codes)
	}
	if err := r.MarkReady(old, old.Generation(), nil); err == nil {
		t.Error("a fenced generation completed the ready handshake")
	}
	// Fencing is idempotent: the first reason wins, the connection closes once.
	r.Fence(old, quicwire.CloseHeartbeatTimeout, "late")
	if code, _, _ := old.FenceReason(); code != quicwire.CloseSuperseded || len(oldCloser.codes) != 1 {
		t.Errorf("second fence changed the reason to %v or closed again (%v)", code, oldCloser.codes)
	}
	// A fenced Node's next generation still increases.
	r.Fence(cur, quicwire.CloseHeartbeatTimeout, "late")
	next, _ := register(r, "n1")
	if next.Generation() != cur.Generation()+1 {
		t.Errorf("generation after a fence %d, want %d", next.Generation(), cur.Generation()+1)
	}
}

// R9: changes wake whoever waits to re-evaluate queued work.
func TestChangesAreBroadcast(t *testing.T) {
	r := fleet.New(fleet.Options{})
	changed := r.Changed()
	c, _ := register(r, "n1")
	select {
	case <-changed:
	default:
		t.Fatal("registration did not signal a change")
	}
	changed = r.Changed()
	r.MarkReady(c, c.Generation(), nil)
	select {
	case <-changed:
	default:
		t.Fatal("ready did not signal a change")
	}
	changed = r.Changed()
	r.Fence(c, quicwire.CloseShutdown, "")
	select {
	case <-changed:
	default:
		t.Fatal("fence did not signal a change")
	}
}

func TestFencedNodesAreForgottenAfterRetention(t *testing.T) {
	now := time.Unix(0, 0)
	r := fleet.New(fleet.Options{Now: func() time.Time { return now }})
	c, _ := register(r, "n1")
	r.Fence(c, quicwire.CloseShutdown, "")
	if len(r.Snapshot()) != 1 {
		t.Fatal("fenced node not listed")
	}
	now = now.Add(time.Hour)
	if v := r.Snapshot(); len(v) != 0 {
		t.Fatalf("fenced node still listed an hour later: %+v", v)
	}
	if again, _ := register(r, "n1"); again.Generation() != c.Generation()+1 {
		t.Errorf("generation after being forgotten %d, want %d", again.Generation(), c.Generation()+1)
	}
}

func TestConcurrentRegistrationsGetDistinctGenerations(t *testing.T) {
	r := fleet.New(fleet.Options{})
	var wg sync.WaitGroup
	gens := make(chan uint64, 100)
	for range 100 {
		wg.Go(func() {
			c, _ := register(r, "n1")
			gens <- c.Generation()
		})
	}
	wg.Wait()
	close(gens)
	seen := map[uint64]bool{}
	for g := range gens {
		if seen[g] {
			t.Fatalf("generation %d given twice", g)
		}
		seen[g] = true
	}
	cur, _ := r.Current("n1")
	if cur.Generation() != 100 || cur.State() != fleet.Registering {
		t.Errorf("current generation %d (%s), want the last, 100", cur.Generation(), cur.State())
	}
}
