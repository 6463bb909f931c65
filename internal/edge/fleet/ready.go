package fleet

import (
	"slices"
	"strings"
)

// Ready returns every Node's current generation that is ready (R1) and not
// suspect (P4), sorted by Node id: the connections a scheduler may place
// work on. Read
// Changed() before calling it so that no change after the read is missed.
func (r *Registry) Ready() []*Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Conn, 0, len(r.nodes))
	for _, c := range r.nodes {
		if c.state == Ready && c.suspectSince.IsZero() {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b *Conn) int { return strings.Compare(a.info.NodeID, b.info.NodeID) })
	return out
}

// Offers reports whether any provider of any Node the registry holds, in
// any state, offers a target for which match holds: whether a model is
// known at all (gateway.Known).
func (r *Registry) Offers(match func(nodeID, provider, adapter, target string) bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, c := range r.nodes {
		for _, p := range c.providers {
			for _, t := range p.GetTargets() {
				if match(id, p.GetName(), p.GetAdapter(), t.GetName()) {
					return true
				}
			}
		}
	}
	return false
}
