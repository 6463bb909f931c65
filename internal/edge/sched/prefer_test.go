package sched_test

import (
	"slices"
	"testing"
	"testing/synctest"

	"github.com/iop-dev/iop/internal/edge/sched"
)

// Issue 21, session affinity: the preferred candidate (where the session's
// last turn ran) is picked while it is not more than PreferSlack busier
// than the least busy one; past that the least busy is, so one hot session
// spreads over the fleet rather than pinning its Node.
func TestThePreferredCandidateIsPickedWithinBoundedLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("a", provider("p", "ollama", 4, "m"))
		f.join("b", provider("p", "ollama", 4, "m"))
		prefer := &sched.Candidate{NodeID: "a", Provider: "p", Target: "m"}
		var got []string
		for range 8 { // every slot held: the load grows
			r := req("r", "m")
			r.Prefer, r.PreferSlack = prefer, 0.5
			got = append(got, f.acquire(r).Candidate.NodeID)
		}
		// a takes turns while its share in use is at most b's plus half:
		// 0, 1/4 and 2/4 against b's 0; at 3/4 b is picked; a again at
		// 3/4 against b's 1/4; then a is full.
		if want := []string{"a", "a", "a", "b", "a", "b", "b", "b"}; !slices.Equal(got, want) {
			t.Fatalf("picks %v, want %v", got, want)
		}
	})
}

// A preference the request cannot use is ignored: a candidate of another
// model, one already tried, or one that is gone; the least busy is picked.
func TestAPreferenceThatCannotBeUsedIsIgnored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("a", provider("p", "ollama", 4, "m"))
		f.join("b", provider("p", "ollama", 4, "m", "other"))
		held := f.acquire(sched.Request{Model: "m", Match: onNode("b")}) // b: 1 of 4 in use
		defer held.Release()
		for name, r := range map[string]sched.Request{
			"another model": {Model: "m", Prefer: &sched.Candidate{NodeID: "b", Provider: "p", Target: "other"}, PreferSlack: 1},
			"already tried": {Model: "m", Prefer: &sched.Candidate{NodeID: "b", Provider: "p", Target: "m"}, PreferSlack: 1, Exclude: []sched.Candidate{held.Candidate}},
			"a node gone":   {Model: "m", Prefer: &sched.Candidate{NodeID: "c", Provider: "p", Target: "m"}, PreferSlack: 1},
			"no slack left": {Model: "m", Prefer: &sched.Candidate{NodeID: "b", Provider: "p", Target: "m"}, PreferSlack: 0},
			"no preference": {Model: "m"},
		} {
			slot := f.acquire(r)
			if got := slot.Candidate.NodeID; got != "a" {
				t.Errorf("%s: picked %s, want the least busy, a", name, got)
			}
			slot.Release()
		}
		r := sched.Request{Model: "m", Prefer: &sched.Candidate{NodeID: "b", Provider: "p", Target: "m"}, PreferSlack: 0.25}
		slot := f.acquire(r)
		if got := slot.Candidate.NodeID; got != "b" {
			t.Errorf("within the slack: picked %s, want the preferred, b", got)
		}
		slot.Release()
	})
}
