package dispatch

import (
	"container/list"
	"crypto/sha256"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/edge/sched"
)

// Session affinity: an agent sends the same growing prompt turn after
// turn, and the model server that ran the last turn holds its prefix in
// its prompt (KV) cache, so the next turn landing there skips most of its
// prefill. A request that names its session (Plan.Session: a session id
// header, prompt_cache_key...) prefers the candidate that ran the
// session's last turn, within bounded load (sched.Request.Prefer).
//
// Sessions are keyed by principal, name and model together, hashed: one
// principal's key never steers another's work, a session's turns on
// another model (an agent's small model for side tasks) keep their own
// place and leave the main model's alone (a prompt cache is a model's),
// and the table keeps no client-chosen string. It is bounded in size (the least recently used
// session is forgotten first) and in time (a session idle past
// SessionIdle is forgotten).

// Bounds of the session table.
const (
	// MaxSessions is how many sessions the table remembers.
	MaxSessions = 100_000
	// SessionIdle is how long a session's place is remembered after its
	// last turn: longer than an agent's pause for its user, shorter than
	// a model server keeps an idle prompt cache warm under other load.
	SessionIdle = time.Hour
	// AffinitySlack is how much busier, as a share of capacity, the
	// session's last candidate may be than the least busy one and still be
	// picked (sched.Request.PreferSlack): with capacity 4, two runs more.
	// A cold prefill of a long session costs seconds; a place in a batch
	// beside two more runs costs little.
	AffinitySlack = 0.5
)

// Turn outcomes of a session's work, as counted (the sessions metric and
// the status page).
const (
	TurnNew           = "new"            // the session's first turn here, or one forgotten
	TurnStuck         = "stuck"          // ran where the last turn did
	TurnMovedBusy     = "moved_busy"     // the last place was too busy (bounded load) or full
	TurnMovedGone     = "moved_gone"     // the last place is no candidate now (Node gone, unhealthy, model moved)
	TurnMovedFailover = "moved_failover" // the last place failed before its first byte
)

// TurnOutcomes lists the outcomes, for metrics that start at zero.
var TurnOutcomes = []string{TurnNew, TurnStuck, TurnMovedBusy, TurnMovedGone, TurnMovedFailover}

// sessionID is a session's key in the table.
type sessionID [sha256.Size]byte

func sessionOf(principal, session, model string) sessionID {
	h := sha256.New()
	for _, s := range []string{principal, session, model} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	var id sessionID
	h.Sum(id[:0])
	return id
}

// place is where a session's last turn ran.
type place struct {
	id       sessionID
	node     string
	provider string
	target   string
	at       time.Time
}

// sessions is the table. Its methods are safe for concurrent use.
type sessions struct {
	now func() time.Time

	mu     sync.Mutex
	byID   map[sessionID]*list.Element // of *place
	recent *list.List                  // most recent turn first
	turns  map[string]uint64           // by outcome
}

func newSessions(now func() time.Time) *sessions {
	return &sessions{now: now, byID: make(map[sessionID]*list.Element), recent: list.New(), turns: make(map[string]uint64)}
}

// last is where id's last turn ran, if it is remembered.
func (s *sessions) last(id sessionID) (*sched.Candidate, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byID[id]
	if !ok {
		return nil, false
	}
	p := e.Value.(*place)
	if s.now().Sub(p.at) > SessionIdle {
		s.forgetLocked(e)
		return nil, false
	}
	return &sched.Candidate{NodeID: p.node, Provider: p.provider, Target: p.target}, true
}

// ran records that id's turn ran on c, with its outcome.
func (s *sessions) ran(id sessionID, c sched.Candidate, outcome string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.turns[outcome]++
	now := s.now()
	if e, ok := s.byID[id]; ok {
		p := e.Value.(*place)
		p.node, p.provider, p.target, p.at = c.NodeID, c.Provider, c.Target, now
		s.recent.MoveToFront(e)
		return
	}
	s.byID[id] = s.recent.PushFront(&place{id: id, node: c.NodeID, provider: c.Provider, target: c.Target, at: now})
	for s.recent.Len() > MaxSessions {
		s.forgetLocked(s.recent.Back())
	}
	// The oldest are idle longest: forget those past SessionIdle.
	for e := s.recent.Back(); e != nil && now.Sub(e.Value.(*place).at) > SessionIdle; e = s.recent.Back() {
		s.forgetLocked(e)
	}
}

func (s *sessions) forgetLocked(e *list.Element) {
	delete(s.byID, e.Value.(*place).id)
	s.recent.Remove(e)
}

// SessionStats is what the session table holds and has seen.
type SessionStats struct {
	// Sessions is how many sessions' places are remembered.
	Sessions int `json:"sessions"`
	// Turns counts the turns of named sessions by outcome (Turn*).
	Turns map[string]uint64 `json:"turns"`
}

func (s *sessions) stats() SessionStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	turns := make(map[string]uint64, len(TurnOutcomes))
	for _, o := range TurnOutcomes {
		turns[o] = s.turns[o]
	}
	return SessionStats{Sessions: s.recent.Len(), Turns: turns}
}
