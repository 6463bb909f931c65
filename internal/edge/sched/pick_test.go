package sched_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	fleet1 "github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Scheduling: among candidates with a free slot, the one with the largest
// share of its capacity free wins.
func TestPicksTheCandidateWithTheMostFreeCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("big", provider("p", "ollama", 4, "m"))
		f.join("small", provider("p", "ollama", 1, "m"))
		for range 3 { // big: 1 of 4 free
			f.acquire(sched.Request{Model: "m", Match: onNode("big")})
		}
		for i, want := range []string{"small", "big"} { // 1/1 beats 1/4; then only big is free
			if got := f.acquire(req("r", "m")).Candidate.NodeID; got != want {
				t.Fatalf("pick %d on %s, want %s", i, got, want)
			}
		}
		_, err := f.s.Acquire(t.Context(), sched.Request{Model: "m"})
		wantRefusal(t, err, sched.ReasonQueueFull)
	})
}

// Scheduling: equal candidates take turns, so load spreads.
func TestEqualCandidatesTakeTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		for _, id := range []string{"a", "b", "c"} {
			f.join(id, provider("p", "ollama", 2, "m"))
		}
		var got []string
		for range 6 {
			slot := f.acquire(req("r", "m"))
			got = append(got, slot.Candidate.NodeID)
			slot.Release()
		}
		seen := map[string]int{}
		for i, id := range got {
			seen[id]++
			if i > 0 && got[i-1] == id {
				t.Fatalf("picks %v: %s twice in a row while others were as free", got, id)
			}
		}
		if seen["a"] != 2 || seen["b"] != 2 || seen["c"] != 2 {
			t.Fatalf("picks %v, want each node twice", got)
		}
	})
}

// R1: only online providers with capacity on ready, current generations
// are candidates; without one a request fails at once and is not queued.
func TestNoCandidateRefusesAtOnce(t *testing.T) {
	offline := provider("p", "ollama", 1, "m")
	offline.State = wirepb.ProviderState_PROVIDER_STATE_OFFLINE
	starting := provider("p", "ollama", 1, "m")
	starting.State = wirepb.ProviderState_PROVIDER_STATE_STARTING
	for _, tc := range []struct {
		name  string
		setup func(f *fleet)
		r     sched.Request
	}{
		{"no nodes", func(f *fleet) {}, req("r", "m")},
		{"node still registering", func(f *fleet) {
			f.reg.Register(fleet1.ConnInfo{NodeID: "n", Providers: []*wirepb.Provider{provider("p", "ollama", 1, "m")}})
		}, req("r", "m")},
		{"node draining", func(f *fleet) { f.reg.MarkDraining(f.join("n", provider("p", "ollama", 1, "m"))) }, req("r", "m")},
		{"node fenced", func(f *fleet) {
			f.reg.Fence(f.join("n", provider("p", "ollama", 1, "m")), quicwire.CloseHeartbeatTimeout, "")
		}, req("r", "m")},
		{"provider offline", func(f *fleet) { f.join("n", offline) }, req("r", "m")},
		{"provider starting", func(f *fleet) { f.join("n", starting) }, req("r", "m")},
		{"provider without capacity", func(f *fleet) { f.join("n", provider("p", "ollama", 0, "m")) }, req("r", "m")},
		{"another model", func(f *fleet) { f.join("n", provider("p", "ollama", 1, "other")) }, req("r", "m")},
		{"every candidate excluded", func(f *fleet) { f.join("n", provider("p", "ollama", 1, "m")) }, sched.Request{
			Model: "m", QueueTimeout: time.Minute, MaxQueueDepth: 10,
			Exclude: []sched.Candidate{{NodeID: "n", Generation: 1, Provider: "p"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFleet(t)
				tc.setup(f)
				start := time.Now()
				_, err := f.s.Acquire(t.Context(), tc.r)
				re := wantRefusal(t, err, sched.ReasonNoCandidate)
				if !errors.Is(err, sched.ErrNoCandidate) || errors.Is(err, sched.ErrQueueFull) || re.Busy() {
					t.Errorf("errors.Is / Busy disagree with reason %s", re.Reason)
				}
				if waited := time.Since(start); waited != 0 {
					t.Errorf("refused after %s, want at once", waited)
				}
				if q := f.s.Snapshot(); len(q) != 0 {
					t.Errorf("queues %+v, want none", q)
				}
			})
		})
	}
}

// Failover: a candidate already tried is skipped; the same Node's next
// generation is a new candidate.
func TestExcludeSkipsAFailedCandidate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		a := f.join("a", provider("p", "ollama", 4, "m"))
		f.join("b", provider("p", "ollama", 1, "m"))
		first := f.acquire(sched.Request{Model: "m", Match: onNode("a")})
		first.Release()

		r := req("r", "m")
		r.Exclude = []sched.Candidate{first.Candidate}
		for range 3 { // a would be as free as b; it is never picked
			slot := f.acquire(r)
			if slot.Candidate.NodeID != "b" {
				t.Fatalf("picked %s, which was excluded", slot.Candidate.NodeID)
			}
			slot.Release()
		}
		r.Exclude = append(r.Exclude, sched.Candidate{NodeID: "b", Generation: 1, Provider: "p"})
		_, err := f.s.Acquire(t.Context(), r)
		wantRefusal(t, err, sched.ReasonNoCandidate)

		f.reg.Fence(a, quicwire.CloseHeartbeatTimeout, "")
		a2 := f.join("a", provider("p", "ollama", 4, "m"))
		slot := f.acquire(r)
		if slot.Candidate.NodeID != "a" || slot.Candidate.Generation != a2.Generation() || slot.Conn() != a2 {
			t.Fatalf("picked %+v, want a's new generation %d", slot.Candidate, a2.Generation())
		}
	})
}

// Routes and the Ollama API tunnel filter candidates with Match: a
// request that wants the ollama adapter never lands on another one, and
// waits for it rather than take a free slot elsewhere.
func TestMatchFiltersByAdapter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("n", provider("ol", "ollama", 1, "m"), provider("oa", "openai", 4, "m"))
		ollama := req("r", "m")
		ollama.Match = func(c sched.Candidate) bool { return c.Adapter == "ollama" && sched.SameModel(c.Target, "m") }
		held := f.acquire(ollama)
		if held.Candidate.Provider != "ol" || held.Candidate.Adapter != "ollama" {
			t.Fatalf("picked %+v, want the ollama provider", held.Candidate)
		}
		ollama.QueueTimeout = 0
		_, err := f.s.Acquire(t.Context(), ollama)
		wantRefusal(t, err, sched.ReasonQueueFull)
		if other := f.acquire(req("r", "m")); other.Candidate.Provider != "oa" {
			t.Fatalf("unfiltered request picked %+v, want the free openai provider", other.Candidate)
		}
	})
}

// Ollama names a model without a tag as name:latest; a request for
// "llama3" reaches a target "llama3:latest".
func TestImplicitLatestTag(t *testing.T) {
	for _, tc := range []struct {
		target, model string
		want          bool
	}{
		{"llama3", "llama3", true},
		{"llama3:latest", "llama3", true},
		{"llama3:latest", "llama3:latest", true},
		{"llama3:8b", "llama3", false},
		{"llama3:latest", "llama3:8b", false},
		{"llama3", "llama3:latest", false},
		{"llama3.2:latest", "llama3", false},
		{"registry:5000/ns/llama3:latest", "registry:5000/ns/llama3", true},
		{"ns/llama3:latest", "ns/llama3", true},
	} {
		if got := sched.SameModel(tc.target, tc.model); got != tc.want {
			t.Errorf("SameModel(%q, %q) = %v, want %v", tc.target, tc.model, got, tc.want)
		}
	}
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("n", provider("p", "ollama", 1, "llama3:8b", "llama3:latest"))
		if got := f.acquire(req("r", "llama3")).Candidate.Target; got != "llama3:latest" {
			t.Fatalf("target %q, want llama3:latest", got)
		}
	})
}

// R6 at the Edge: a target with provider_unhealthy evidence is out of
// selection until its Node reports it back; one with request_stalled
// evidence is picked after its healthier peers.
func TestHealthOverlayShapesSelection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		a := f.join("a", provider("p", "ollama", 1, "m"))
		b := f.join("b", provider("p", "ollama", 1, "m"))
		obs := func(c *fleet1.Conn, seq uint64, class string) {
			t.Helper()
			if err := f.reg.ObserveStall(c, &wirepb.StallObservation{NodeId: c.NodeID(), Generation: c.Generation(),
				HealthObservationSeq: seq, Provider: "p", Target: "m", LivenessClassification: class}); err != nil {
				t.Fatal(err)
			}
		}
		obs(a, 1, "request_stalled")
		for range 4 { // equal capacity: b, with fewer stalls, always first
			slot := f.acquire(req("r", "m"))
			if slot.Candidate.NodeID != "b" {
				t.Fatalf("picked %s, want b (a has a stall against it)", slot.Candidate.NodeID)
			}
			slot.Release()
		}
		obs(b, 1, "provider_unhealthy")
		for range 2 { // b is out: only a, stall or not
			slot := f.acquire(req("r", "m"))
			if slot.Candidate.NodeID != "a" {
				t.Fatalf("picked %s, want a (b is unhealthy)", slot.Candidate.NodeID)
			}
			slot.Release()
		}
		obs(a, 2, "provider_unhealthy")
		_, err := f.s.Acquire(t.Context(), req("r", "m"))
		wantRefusal(t, err, sched.ReasonNoCandidate)
		// b's Node reports the target back (after its observation 1).
		f.reg.UpdateProviders(b, []*wirepb.Provider{provider("p", "ollama", 1, "m")}, 1)
		if slot := f.acquire(req("r", "m")); slot.Candidate.NodeID != "b" {
			t.Fatalf("picked %s after b recovered", slot.Candidate.NodeID)
		}
	})
}
