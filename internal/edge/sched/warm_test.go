package sched_test

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// ollama is an online Ollama provider serving targets "m" and "o" whose
// Node reports what it holds loaded: loaded lists "name" or "name/in_use";
// maxLoaded is its max_loaded (0: not known).
func ollama(capacity, maxLoaded int, loaded ...string) *wirepb.Provider {
	p := provider("p", "ollama", capacity, "m", "o")
	p.LoadedKnown, p.MaxLoaded = true, uint32(maxLoaded)
	for _, l := range loaded {
		m := &wirepb.LoadedModel{Name: l, Size: 1 << 30, SizeVram: 1 << 30}
		if name, use, ok := strings.Cut(l, "/"); ok {
			var n uint32
			fmt.Sscan(use, &n)
			m.Name, m.InUse = name, n
		}
		p.Loaded = append(p.Loaded, m)
	}
	return p
}

// warmReq is a request for model routed warm first.
func warmReq(model string) sched.Request {
	r := req("r", model)
	r.WarmFirst = true
	return r
}

// Issue 23, P9: among candidates that can take a request now, the scheduler
// prefers the model loaded, then room to load it without evicting a model
// in use, then the rest; within bounded load (WarmSlack), so a hot model
// spills rather than queue behind its warm Node.
func TestWarmFirstPicks(t *testing.T) {
	unknown := provider("p", "ollama", 4, "m", "o") // an older Node: loaded_known false
	all := provider("p", "openai", 4, "m", "o")
	all.LoadedKnown, all.AllLoaded = true, true
	for _, tc := range []struct {
		name string
		n1   *wirepb.Provider
		n2   *wirepb.Provider
		// held are slots taken before the pick, each "node:model".
		held       []string
		model      string
		wantNode   string
		wantChoice sched.Choice
	}{
		{"the model loaded beats a free server", ollama(4, 1, "m"), ollama(4, 1), nil, "m", "n1", sched.ChoiceWarm},
		{"loaded under its :latest name", ollama(4, 1), ollama(4, 1, "m:latest"), nil, "m", "n2", sched.ChoiceWarm},
		{"all loaded is warm", ollama(4, 1, "o/1"), all, nil, "m", "n2", sched.ChoiceWarm},
		{"evicting an idle model beats waiting for one in use", ollama(4, 1, "o/1"), ollama(4, 1, "o"), nil, "m", "n2", sched.ChoiceEvict},
		{"room beats evicting", ollama(4, 1, "o"), ollama(4, 2, "o"), nil, "m", "n2", sched.ChoiceRoom},
		{"below max_loaded is room", ollama(4, 2, "o/1"), ollama(4, 1, "o/1"), nil, "m", "n1", sched.ChoiceRoom},
		{"at max_loaded with every model in use is cold", ollama(4, 2, "o/1", "x/1"), ollama(4, 0, "o/2"), []string{"n2:o"}, "m", "n1", sched.ChoiceCold},
		{"a Node that does not say ranks with room", unknown, ollama(4, 1, "o/1"), nil, "m", "n1", sched.ChoiceUnknown},
		{"nothing warm or with room anywhere: cold at once", ollama(4, 1, "o/1"), ollama(4, 1, "o/2"), nil, "m", "n1", sched.ChoiceCold},
		{"warm within the bound", ollama(4, 1, "m"), ollama(4, 1), []string{"n1:m", "n1:m"}, "m", "n1", sched.ChoiceWarm},
		{"warm past the bound spills to room", ollama(4, 1, "m"), ollama(4, 1), []string{"n1:m", "n1:m", "n1:m"}, "m", "n2", sched.ChoiceSpill},
		{"a warm server past the bound is still better than a cold one", ollama(4, 1, "m"), ollama(4, 1, "o/1"), []string{"n1:m", "n1:m", "n1:m"}, "m", "n1", sched.ChoiceWarm},
		{"this Edge's work on a model there makes it warm", ollama(4, 1), ollama(4, 1), []string{"n2:m"}, "m", "n2", sched.ChoiceWarm},
		{"this Edge's work on another model fills a one-model server", ollama(4, 1), ollama(4, 1), []string{"n2:o"}, "m", "n1", sched.ChoiceRoom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFleet(t)
				f.join("n1", tc.n1)
				f.join("n2", tc.n2)
				for _, h := range tc.held {
					node, model, _ := strings.Cut(h, ":")
					r := sched.Request{Model: model, Match: func(c sched.Candidate) bool { return c.NodeID == node && c.Target == model }}
					f.acquire(r)
				}
				got := f.acquire(warmReq(tc.model)).Candidate
				if got.NodeID != tc.wantNode || got.Choice != tc.wantChoice {
					t.Fatalf("picked %s (%s), want %s (%s)", got.NodeID, got.Choice, tc.wantNode, tc.wantChoice)
				}
			})
		})
	}
}

// Issue 23: a request whose model is warm on a busy Node waits for a slot
// there rather than load it in place of another model, idle or in use,
// for ColdWait at most; then it spills. One that frees in time is taken; a
// request that may not wait spills at once.
func TestEvictAndColdAreTakenAfterColdWaitOnly(t *testing.T) {
	for _, other := range []string{"o", "o/1"} {
		t.Run(other, func(t *testing.T) { evictAfterColdWait(t, other) })
	}
}

func evictAfterColdWait(t *testing.T, other string) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("n1", ollama(1, 1, "m"))
		f.join("n2", ollama(4, 1, other))
		busy := f.acquire(sched.Request{Model: "m", Match: onNode("n1")})
		held := f.enqueue(warmReq("m"))
		time.Sleep(sched.ColdWait - time.Millisecond)
		synctest.Wait()
		queued(t, held)
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if c := held.granted(t).Candidate; c.NodeID != "n2" || c.Choice != sched.ChoiceSpill {
			t.Fatalf("after ColdWait: %s (%s), want n2 (spill)", c.NodeID, c.Choice)
		}
		held.granted(t).Release() // n2 is not warm for m again

		waiter := f.enqueue(warmReq("m"))
		time.Sleep(sched.ColdWait / 2)
		busy.Release()
		synctest.Wait()
		if c := waiter.granted(t).Candidate; c.NodeID != "n1" || c.Choice != sched.ChoiceWarm {
			t.Fatalf("n1 freed within ColdWait: %s (%s), want n1 (warm)", c.NodeID, c.Choice)
		}

		now := warmReq("m")
		now.QueueTimeout = 0
		if c := f.acquire(now).Candidate; c.NodeID != "n2" {
			t.Fatalf("a request that may not wait went to %s, want n2", c.NodeID)
		}
	})
}

// Issue 23: two models over two one-model servers: each model goes where
// it is loaded, turn after turn; without warm-first the picks take turns
// and half of them land cold (the choice still says so).
func TestWarmFirstKeepsEachModelWhereItIsLoaded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("n1", ollama(4, 1, "m"))
		f.join("n2", ollama(4, 1, "o"))
		for i := range 8 {
			model, want := "m", "n1"
			if i%2 == 1 {
				model, want = "o", "n2"
			}
			slot := f.acquire(warmReq(model))
			if slot.Candidate.NodeID != want || slot.Candidate.Choice != sched.ChoiceWarm {
				t.Fatalf("request %d for %s went to %s (%s), want %s (warm)", i, model, slot.Candidate.NodeID, slot.Candidate.Choice, want)
			}
			slot.Release()
		}
		nodes := map[string]int{}
		choices := map[sched.Choice]int{}
		for range 4 {
			slot := f.acquire(req("r", "m")) // warm-first off
			nodes[slot.Candidate.NodeID]++
			choices[slot.Candidate.Choice]++
			slot.Release()
		}
		if nodes["n1"] != 2 || nodes["n2"] != 2 || choices[sched.ChoiceWarm] != 2 || choices[sched.ChoiceEvict] != 2 {
			t.Fatalf("without warm-first: nodes %v, choices %v; want turns, half of them evicting", nodes, choices)
		}
	})
}

// Issue 23: session affinity stays first while its place holds the model;
// a place whose Node reports the model unloaded (its prompt cache gone
// with it) gives way to a warm one.
func TestAffinityGivesWayWhereTheModelIsNoLongerLoaded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("n1", ollama(4, 1, "m"))
		f.join("n2", ollama(4, 1, "m"))
		r := warmReq("m")
		r.Prefer, r.PreferSlack = &sched.Candidate{NodeID: "n2", Provider: "p", Target: "m"}, 0.5
		for range 3 {
			slot := f.acquire(r)
			if slot.Candidate.NodeID != "n2" {
				t.Fatalf("the session's place n2 holds m; went to %s", slot.Candidate.NodeID)
			}
			slot.Release()
		}
		f.join("n2", ollama(4, 1, "o")) // a new generation: m unloaded there
		slot := f.acquire(r)
		if slot.Candidate.NodeID != "n1" || slot.Candidate.Choice != sched.ChoiceWarm {
			t.Fatalf("went to %s (%s), want n1 (warm)", slot.Candidate.NodeID, slot.Candidate.Choice)
		}
	})
}
