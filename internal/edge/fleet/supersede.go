package fleet

import "time"

// Contested identities (issue 26). A Node that reconnects while the Edge
// still holds its old connection supersedes it (R9): that is how a Node
// comes back after a crash or a cut link, and how it moves to a fresh
// connection dialled beside a silent one. Two connections that keep
// superseding each other are something else: one Node certificate in two
// places (stolen or cloned), each copy fencing the other as it reconnects.
//
// The rule: a supersede is contested when, within ContestWindow, the Node
// was superseded at least ContestedAfter times (this one included) and one
// of those supersedes came from a remote address that an earlier one of
// them had pushed out. A Node that crashes in a loop comes back from a new
// port each time and never from one it lost; one that re-dials from its
// own socket supersedes from the same address, which is not counted at all.
const (
	ContestWindow  = time.Minute
	ContestedAfter = 3
	// contestHistory bounds what is kept per Node: far more than the rule
	// needs, however fast the copies fight.
	contestHistory = 32
)

// Supersede is what registering a connection did to the Node's previous,
// still live generation.
type Supersede struct {
	// Generation is the new generation; Previous the one it fenced.
	Generation, Previous uint64
	// Addr is the new connection's remote address; PreviousAddr the
	// fenced one's.
	Addr, PreviousAddr string
	// Drains: the previous generation was replaced but left to drain its
	// streams (ConnInfo.DrainPrevious), not fenced.
	Drains bool
	// Recent is how many supersedes from another address the Node had in
	// the last ContestWindow, this one included (0 when Addr is
	// PreviousAddr).
	Recent int
	// Contested: the Node's identity is presented by two connections
	// that keep superseding each other (see ContestWindow).
	Contested bool
	// Warn: say so now. It holds for the first contested supersede of a
	// Node and then at most once per ContestWindow; Unwarned is how many
	// contested supersedes of the Node went by without a warning since.
	Warn     bool
	Unwarned int
}

// supersedeEvent is one supersede from another address.
type supersedeEvent struct {
	at         time.Time
	addr, prev string
}

// contestState is a Node's recent supersedes and what was said of them.
type contestState struct {
	events   []supersedeEvent
	warnedAt time.Time
	unwarned int
	total    uint64 // contested supersedes ever: a counter
}

// superseded records that c superseded old, a live generation, and returns
// what it was. Callers hold r.mu.
func (r *Registry) supersededLocked(c, old *Conn, now time.Time) *Supersede {
	s := &Supersede{Generation: c.generation, Previous: old.generation, Addr: c.info.RemoteAddr, PreviousAddr: old.info.RemoteAddr}
	if s.Addr == s.PreviousAddr {
		return s
	}
	if r.contest == nil {
		r.contest = make(map[string]*contestState)
	}
	st := r.contest[c.info.NodeID]
	if st == nil {
		st = &contestState{}
		r.contest[c.info.NodeID] = st
	}
	keep := st.events[:0]
	for _, e := range st.events {
		if now.Sub(e.at) < ContestWindow {
			keep = append(keep, e)
		}
	}
	st.events = append(keep, supersedeEvent{at: now, addr: s.Addr, prev: s.PreviousAddr})
	if len(st.events) > contestHistory {
		st.events = st.events[len(st.events)-contestHistory:]
	}
	s.Recent = len(st.events)
	s.Contested = s.Recent >= ContestedAfter && cameBack(st.events)
	if !s.Contested {
		return s
	}
	st.total++
	if st.warnedAt.IsZero() || now.Sub(st.warnedAt) >= ContestWindow {
		s.Warn, s.Unwarned = true, st.unwarned
		st.warnedAt, st.unwarned = now, 0
	} else {
		st.unwarned++
	}
	return s
}

// cameBack reports whether an address pushed out by one supersede of
// events superseded in turn later.
func cameBack(events []supersedeEvent) bool {
	lost := make(map[string]bool, len(events))
	for _, e := range events {
		if lost[e.addr] {
			return true
		}
		lost[e.prev] = true
	}
	return false
}

// Superseded reports what registering c did to its Node's previous
// generation, if that one was still live.
func (c *Conn) Superseded() (Supersede, bool) {
	if c.superseded == nil {
		return Supersede{}, false
	}
	return *c.superseded, true
}

// Contested returns, by Node id, how many contested supersedes each Node
// has had since the Edge started (a counter; Nodes with none are absent).
func (r *Registry) Contested() map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]uint64, len(r.contest))
	for id, st := range r.contest {
		if st.total > 0 {
			out[id] = st.total
		}
	}
	return out
}
