package dispatch

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Issue 21, session affinity, through the loop: a session's turn prefers
// where its last turn ran, and each turn is counted as it went: new, stuck,
// or moved because the last place was busy, gone, or failed it. A session
// name never steers another principal's work, and an idle session is
// forgotten.
func TestATurnPrefersWhereItsSessionsLastTurnRan(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	fl := newFakeFleet([]string{"a", "b"}, nil)
	fl.busy = map[string]bool{}
	m := edgemetrics.New(nil, nil)
	d := New(loopConfig(t), fl, fl, Options{Metrics: m, Now: func() time.Time { return now }})
	plan := func(principal, session string) Plan {
		p, err := d.Resolve(auth.Principal{Name: principal, Routes: []string{edgeconfig.AllRoutes}}, "m")
		if err != nil {
			t.Fatal(err)
		}
		p.Session = session
		return p
	}
	turn := func(principal, session string) string {
		t.Helper()
		r, err := d.StartRun(t.Context(), new(plan(principal, session)), &wirepb.RunRequest{}, Watch{})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		return r.Node().NodeID
	}
	// The fake picks the first candidate free of a preference: b only
	// when a session's last turn ran there.
	steps := []struct {
		name      string
		setup     func()
		principal string
		session   string
		node      string
		outcome   string
	}{
		{"a session's first turn", nil, "alice", "s1", "a", TurnNew},
		{"its next turn", func() { fl.nodes = []string{"b", "a"} }, "alice", "s1", "a", TurnStuck},
		{"its last place past the bounded load", func() { fl.busy["a"] = true }, "alice", "s1", "b", TurnMovedBusy},
		{"then it sticks to the new place", func() { fl.busy["a"] = false; fl.nodes = []string{"a", "b"} }, "alice", "s1", "b", TurnStuck},
		{"its last place gone", func() { fl.nodes = []string{"a"} }, "alice", "s1", "a", TurnMovedGone},
		{"its last place fails before the first byte", func() {
			fl.nodes = []string{"a", "b"}
			fl.firsts["a"] = []first{refuses, answers}
		}, "alice", "s1", "b", TurnMovedFailover},
		{"another principal's session of the same name", func() { fl.nodes = []string{"a", "b"} }, "bob", "s1", "a", TurnNew},
		{"a session idle past SessionIdle", func() { now = now.Add(SessionIdle + time.Second) }, "alice", "s1", "a", TurnNew},
		{"no session: nothing counted", nil, "alice", "", "a", ""},
	}
	want := map[string]uint64{}
	for _, s := range steps {
		if s.setup != nil {
			s.setup()
		}
		if got := turn(s.principal, s.session); got != s.node {
			t.Fatalf("%s: ran on %s, want %s", s.name, got, s.node)
		}
		if s.outcome != "" {
			want[s.outcome]++
		}
		for _, o := range TurnOutcomes {
			if got := d.Sessions().Turns[o]; got != want[o] {
				t.Fatalf("%s: %d turns %s, want %d (all: %v)", s.name, got, o, want[o], d.Sessions().Turns)
			}
		}
	}
	if got := d.Sessions().Sessions; got != 1 {
		t.Errorf("%d sessions remembered, want 1 (alice's s1; bob's idled out with hers)", got)
	}
	if !slices.Equal(TurnOutcomes, edgemetrics.SessionOutcomes) {
		t.Errorf("the metric's outcomes %v differ from the dispatcher's %v", edgemetrics.SessionOutcomes, TurnOutcomes)
	}
}

// The table is bounded: past MaxSessions the least recently used session
// is forgotten, and a session's key holds nothing the client sent.
func TestTheSessionTableIsBounded(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	s := newSessions(func() time.Time { return now })
	c := sched.Candidate{NodeID: "n", Provider: "p", Target: "m"}
	first := sessionOf("alice", "first", "m")
	s.ran(first, c, TurnNew)
	for i := range MaxSessions {
		now = now.Add(time.Microsecond)
		s.ran(sessionOf("alice", strconv.Itoa(i), "m"), c, TurnNew)
	}
	if got := s.stats().Sessions; got != MaxSessions {
		t.Errorf("%d sessions, want the bound %d", got, MaxSessions)
	}
	if _, ok := s.last(first); ok {
		t.Error("the least recently used session is still remembered past the bound")
	}
	if sessionOf("alice", "s", "m") == sessionOf("bob", "s", "m") || sessionOf("a", "bs", "m") == sessionOf("ab", "s", "m") {
		t.Error("sessions of different principals share a key")
	}
	if sessionOf("alice", "s", "big") == sessionOf("alice", "s", "small") {
		t.Error("a session's turns on two models share a place")
	}
}
