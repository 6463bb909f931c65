package sched

import (
	"cmp"
	"slices"
	"strings"

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
			for _, t := range p.GetTargets() {
				// provider_unhealthy evidence keeps a target out until the
				// Node reports it back (nodes/health.go).
				h := conn.TargetHealth(p.GetName(), t.GetName())
				if h.Unhealthy {
					continue
				}
				s.cands = append(s.cands, candidate{conn: conn, stalls: h.Stalls, connSlots: conn.Slots(), Candidate: Candidate{
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

// pickLocked returns r's candidate with the largest share of its capacity
// free (a candidate whose Node generation holds as many slots as it has
// streams for is busy, whatever its provider's capacity says), then the
// fewest consecutive stalls; ties are taken in turn so that
// equal Nodes share the load. A provider
// counts once however many of its targets match (its first matching
// target is used). ok is false when every candidate is busy.
func (s *Scheduler) pickLocked(r *Request) (c candidate, ok bool) {
	s.tied = s.tied[:0]
	bestFree, bestCap, bestStalls := 0, 1, uint64(0)
	var seen providerKey // the provider last considered
	for i := range s.cands {
		c := &s.cands[i]
		k := c.key()
		if k == seen || !r.matches(c.Candidate) || r.excludes(k) {
			continue
		}
		seen = k
		if c.Capacity-s.inflight[k] <= 0 || s.connSlots[k.conn()] >= c.connSlots || s.fullLocked(k) {
			continue
		}
		free := s.rankFree(c)
		// free/Capacity against bestFree/bestCap, without division.
		switch d := free*bestCap - bestFree*c.Capacity; {
		case d > 0 || d == 0 && c.stalls < bestStalls:
			s.tied = append(s.tied[:0], i)
			bestFree, bestCap, bestStalls = free, c.Capacity, c.stalls
		case d == 0 && c.stalls == bestStalls:
			s.tied = append(s.tied, i)
		}
	}
	if len(s.tied) == 0 {
		return candidate{}, false
	}
	if c, ok := s.preferredLocked(r, bestFree, bestCap); ok {
		return c, true
	}
	if len(s.tied) == 1 {
		return s.cands[s.tied[0]], true
	}
	i := s.tied[s.rr%uint64(len(s.tied))]
	s.rr++
	return s.cands[i], true
}

// preferredLocked is r's preferred candidate, if it can take r and is not
// too much busier than the least busy one, whose free slots of its
// capacity are bestFree of bestCap.
func (s *Scheduler) preferredLocked(r *Request, bestFree, bestCap int) (candidate, bool) {
	p := r.Prefer
	if p == nil {
		return candidate{}, false
	}
	for i := range s.cands {
		c := &s.cands[i]
		if c.NodeID != p.NodeID || c.Provider != p.Provider || c.Target != p.Target {
			continue
		}
		k := c.key()
		if !r.matches(c.Candidate) || r.excludes(k) {
			return candidate{}, false
		}
		if c.Capacity-s.inflight[k] <= 0 || s.connSlots[k.conn()] >= c.connSlots || s.fullLocked(k) {
			return candidate{}, false
		}
		free := s.rankFree(c)
		busy := float64(c.Capacity-free) / float64(c.Capacity)
		least := float64(bestCap-bestFree) / float64(bestCap)
		return *c, busy <= least+r.PreferSlack
	}
	return candidate{}, false
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
