package sched

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Candidate is one place a request can run: an online provider target on
// a ready, current Node generation (R1).
type Candidate struct {
	NodeID     string
	Generation uint64
	Provider   string
	Adapter    string
	Target     string
	// Capacity is the provider's reported maximum of concurrent runs and
	// tunnels, shared by all its targets.
	Capacity int
	// Capabilities are what the provider's adapter implements, as the Node
	// reports them (sdk.Cap*: "embed", "complete", ...), shared by all its
	// targets. Do not modify.
	Capabilities []string
	// MaxRequest is the largest request the Node takes, in bytes
	// (RegisterRequest.max_request_bytes; 0 for one frame).
	MaxRequest int
	// InUse is the provider's slots in use as its Node last reported them
	// (Provider.in_use), by every Edge of the cluster together (issue 22):
	// a hint that ranks a Node whose slots other Edges hold below a free
	// one. The slots this Edge grants are counted against Capacity alone;
	// the Node's busy refusal is the guarantee.
	InUse int
	// Choice is why the scheduler picked this candidate (warm.go): set on
	// a granted Slot's Candidate, empty in candidate lists.
	Choice Choice
}

// providerKey names the capacity a slot counts against: one provider on
// one generation. A new generation of the Node is a new key, so slots held
// on a fenced generation do not count against its successor (R9).
type providerKey struct {
	node     string
	gen      uint64
	provider string
}

func (c Candidate) key() providerKey { return providerKey{c.NodeID, c.Generation, c.Provider} }

// connKey names one Node generation: its slots, all providers together,
// count against its stream limit.
type connKey struct {
	node string
	gen  uint64
}

func (k providerKey) conn() connKey { return connKey{k.node, k.gen} }

// candidate is a Candidate with the connection it lives on.
type candidate struct {
	Candidate
	conn *fleet.Conn
	// stalls is the target's count of consecutive request_stalled
	// observations (the health overlay): it breaks ties.
	stalls uint64
	// connSlots is how many slots the generation may hold at once, all
	// its providers together (fleet.Conn.Slots).
	connSlots int
	// load is what the provider's Node says its server holds loaded,
	// shared by its targets (warm.go).
	load *loadState
}

// SameModel reports whether a provider target serves what a client asked
// for: the same name, or the name without a tag and the target with
// Ollama's implicit ":latest".
func SameModel(target, model string) bool {
	if target == model {
		return true
	}
	return !hasTag(model) && strings.HasSuffix(target, ":latest") && target[:len(target)-len(":latest")] == model
}

// hasTag reports whether an Ollama model name carries a tag. A colon
// before the last slash is a registry port ("host:5000/m"), not a tag.
func hasTag(model string) bool {
	return strings.LastIndexByte(model, ':') > strings.LastIndexByte(model, '/')
}

func (r *Request) matches(c Candidate) bool {
	if r.Match != nil {
		return r.Match(c)
	}
	return SameModel(c.Target, r.Model)
}

func (r *Request) excludes(k providerKey) bool {
	for _, e := range r.Exclude {
		if e.key() == k {
			return true
		}
	}
	return false
}

// refreshLocked rebuilds the candidate list if the registry changed since
// the last build, and reports whether it did. The registry's change
// channel is taken before the registry is read, so a change during the
// read leaves the list marked stale. Callers hold s.mu (lock order:
// s.mu, then the registry's).
func (s *Scheduler) refreshLocked() bool {
	select {
	case <-s.changed:
	default:
		return false
	}
	s.changed = s.reg.Changed()
	s.cands = s.cands[:0]
	for _, conn := range s.reg.Ready() {
		for _, p := range conn.Providers() {
			if p.GetState() != wirepb.ProviderState_PROVIDER_STATE_ONLINE || p.GetCapacity() == 0 {
				continue
			}
			load := newLoadState(p)
			for _, t := range p.GetTargets() {
				// provider_unhealthy evidence keeps a target out until the
				// Node reports it back (nodes/health.go).
				h := conn.TargetHealth(p.GetName(), t.GetName())
				if h.Unhealthy {
					continue
				}
				s.cands = append(s.cands, candidate{conn: conn, stalls: h.Stalls, connSlots: conn.Slots(), load: load, Candidate: Candidate{
					NodeID:       conn.NodeID(),
					Generation:   conn.Generation(),
					Provider:     p.GetName(),
					Adapter:      p.GetAdapter(),
					Target:       t.GetName(),
					Capacity:     int(p.GetCapacity()),
					Capabilities: p.GetCapabilities(),
					MaxRequest:   conn.MaxRequest(),
					InUse:        int(p.GetInUse()),
				}})
			}
		}
	}
	// Targets of one provider stay adjacent: pickLocked relies on it.
	slices.SortFunc(s.cands, func(a, b candidate) int {
		return cmp.Or(strings.Compare(a.NodeID, b.NodeID), strings.Compare(a.Provider, b.Provider), strings.Compare(a.Target, b.Target))
	})
	s.unmarkFullLocked()
	return true
}

// anyCandidateLocked reports whether r has a candidate at all, busy or not.
func (s *Scheduler) anyCandidateLocked(r *Request) bool {
	for i := range s.cands {
		if c := &s.cands[i]; r.matches(c.Candidate) && !r.excludes(c.key()) {
			return true
		}
	}
	return false
}

// eligible is a candidate that can take a request now, as pickLocked
// ranks it.
type eligible struct {
	i      int // in s.cands
	free   int // rankFree
	tier   int // warm.go
	choice Choice
}

// busy is e's share of its capacity in use, for ranking.
func (s *Scheduler) busy(e eligible) float64 {
	c := &s.cands[e.i]
	return float64(c.Capacity-e.free) / float64(c.Capacity)
}

// pickLocked returns r's candidate among those that can take it now (a
// candidate whose Node generation holds as many slots as it has streams
// for is busy, whatever its provider's capacity says), in the order of
// preferences warm.go writes down: session affinity, then warm first
// within bounded load when r.WarmFirst, then the largest share of
// capacity free, the fewest consecutive stalls, and in turn, so that
// equal Nodes share the load. A provider counts once however many of its
// targets match: the warmest of them (the first among equals) is used.
// The candidate comes with its Choice; ok is false when every candidate is
// busy, or, for a request routed warm first that has waited less than
// ColdWait, when only evict or cold ones are free while a warm or room one
// is busy.
func (s *Scheduler) pickLocked(r *Request, waited time.Duration) (c candidate, ok bool) {
	s.elig = s.elig[:0]
	warmAnywhere, loadableAnywhere := false, false
	var seen providerKey // the provider last considered
	last := -1           // its entry in s.elig, if it can take r
	for i := range s.cands {
		c := &s.cands[i]
		k := c.key()
		if !r.matches(c.Candidate) || r.excludes(k) {
			continue
		}
		tier, choice := s.warmthLocked(c)
		warmAnywhere = warmAnywhere || tier == tierWarm
		loadableAnywhere = loadableAnywhere || tier <= tierRoom
		if k == seen {
			if last >= 0 && tier < s.elig[last].tier {
				s.elig[last].i, s.elig[last].tier, s.elig[last].choice = i, tier, choice
			}
			continue
		}
		seen, last = k, -1
		if !s.canTakeLocked(c) {
			continue
		}
		last = len(s.elig)
		s.elig = append(s.elig, eligible{i: i, free: s.rankFree(c), tier: tier, choice: choice})
	}
	if len(s.elig) == 0 {
		return candidate{}, false
	}
	pick := func(e eligible, choice Choice) (candidate, bool) {
		c := s.cands[e.i]
		c.Choice = choice
		return c, true
	}
	all := func(eligible) bool { return true }
	least, _ := s.leastBusy(all)
	if e, ok := s.preferredLocked(r, least); ok {
		return pick(e, e.choice)
	}
	if !r.WarmFirst {
		e, _ := s.bestLocked(all)
		return pick(e, e.choice)
	}
	spilled := func(choice Choice) Choice {
		if warmAnywhere {
			return ChoiceSpill
		}
		return choice
	}
	if least, ok := s.leastBusy(func(e eligible) bool { return e.tier <= tierRoom }); ok {
		bound := least + WarmSlack
		if e, ok := s.bestLocked(func(e eligible) bool { return e.tier == tierWarm && s.busy(e) <= bound }); ok {
			return pick(e, ChoiceWarm)
		}
		e, _ := s.bestLocked(func(e eligible) bool { return e.tier == tierRoom })
		return pick(e, spilled(e.choice))
	}
	if loadableAnywhere && waited < ColdWait {
		return candidate{}, false // a warm or room slot is likely to free first
	}
	if e, ok := s.bestLocked(func(e eligible) bool { return e.tier == tierEvict }); ok {
		return pick(e, spilled(ChoiceEvict))
	}
	e, _ := s.bestLocked(all) // every free one is cold: rather than queue on
	return pick(e, spilled(ChoiceCold))
}

// canTakeLocked reports whether c has a slot free now: below its
// provider's capacity and its connection's stream limit in this Edge's
// count, and not marked full by its Node.
func (s *Scheduler) canTakeLocked(c *candidate) bool {
	k := c.key()
	return c.Capacity-s.inflight[k] > 0 && s.connSlots[k.conn()] < c.connSlots && !s.fullLocked(k)
}

// leastBusy is the smallest share of capacity in use among the entries of
// s.elig that keep admits; ok is false when it admits none.
func (s *Scheduler) leastBusy(keep func(eligible) bool) (least float64, ok bool) {
	for _, e := range s.elig {
		if b := s.busy(e); keep(e) && (!ok || b < least) {
			least, ok = b, true
		}
	}
	return least, ok
}

// bestLocked returns the entry of s.elig that keep admits with the
// largest share of its capacity free, then the fewest consecutive stalls;
// ties are taken in turn. ok is false when keep admits none.
func (s *Scheduler) bestLocked(keep func(eligible) bool) (e eligible, ok bool) {
	s.tied = s.tied[:0]
	bestFree, bestCap, bestStalls := 0, 1, uint64(0)
	for j, e := range s.elig {
		if !keep(e) {
			continue
		}
		c := &s.cands[e.i]
		// free/Capacity against bestFree/bestCap, without division.
		switch d := e.free*bestCap - bestFree*c.Capacity; {
		case len(s.tied) == 0 || d > 0 || d == 0 && c.stalls < bestStalls:
			s.tied = append(s.tied[:0], j)
			bestFree, bestCap, bestStalls = e.free, c.Capacity, c.stalls
		case d == 0 && c.stalls == bestStalls:
			s.tied = append(s.tied, j)
		}
	}
	switch len(s.tied) {
	case 0:
		return eligible{}, false
	case 1:
		return s.elig[s.tied[0]], true
	}
	j := s.tied[s.rr%uint64(len(s.tied))]
	s.rr++
	return s.elig[j], true
}

// preferredLocked is r's preferred candidate's entry, if it can take r,
// is not too much busier than the least busy one (whose share of capacity
// in use is least), and, for a request routed warm first, is warm or does
// not say: a server that unloaded the model dropped its prompt cache too.
func (s *Scheduler) preferredLocked(r *Request, least float64) (eligible, bool) {
	p := r.Prefer
	if p == nil {
		return eligible{}, false
	}
	for i := range s.cands {
		c := &s.cands[i]
		if c.NodeID != p.NodeID || c.Provider != p.Provider || c.Target != p.Target {
			continue
		}
		if !r.matches(c.Candidate) || r.excludes(c.key()) || !s.canTakeLocked(c) {
			return eligible{}, false
		}
		tier, choice := s.warmthLocked(c)
		if r.WarmFirst && tier != tierWarm && choice != ChoiceUnknown {
			return eligible{}, false
		}
		e := eligible{i: i, free: s.rankFree(c), tier: tier, choice: choice}
		return e, s.busy(e) <= least+r.PreferSlack
	}
	return eligible{}, false
}

// rankFree is how many of c's slots are free for ranking: its capacity
// less the larger of this Edge's slots on it and the slots its Node last
// said were in use by every Edge (Candidate.InUse). Never below zero: a
// candidate the hint says is full still takes work when it is the only
// one with room in this Edge's count, and the Node refuses it busy if the
// hint was right.
func (s *Scheduler) rankFree(c *candidate) int {
	return max(c.Capacity-max(s.inflight[c.key()], c.InUse), 0)
}
