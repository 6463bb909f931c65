package sched

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// QueueView is one model's queue as the admin API shows it.
type QueueView struct {
	Model string `json:"model"`
	// Depth is how many requests wait.
	Depth int `json:"depth"`
	// InFlight is how many slots requests for the model hold.
	InFlight int `json:"in_flight"`
	// Waiting lists the waiting requests, first in line first.
	Waiting []WaitingView `json:"waiting"`
}

// WaitingView is one waiting request.
type WaitingView struct {
	ID string `json:"id"`
	// Position is the place in the model's queue, 1 for the next in line.
	Position     int       `json:"position"`
	EnqueuedAt   time.Time `json:"enqueued_at"`
	WaitedMillis float64   `json:"waited_ms"`
}

// LoadView is the slots held on one provider of one Node generation.
type LoadView struct {
	NodeID     string `json:"node"`
	Generation uint64 `json:"generation"`
	Provider   string `json:"provider"`
	Adapter    string `json:"adapter,omitempty"`
	// Capacity is the provider's reported capacity; 0 once it is no
	// longer a candidate.
	Capacity int `json:"capacity"`
	InFlight int `json:"in_flight"`
	// Candidate is false for slots still held on a generation that was
	// fenced or a provider that went offline: they count for nothing.
	Candidate bool `json:"candidate"`
}

// Snapshot returns every model that has requests waiting or running,
// sorted by model.
func (s *Scheduler) Snapshot() []QueueView {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	views := make([]QueueView, 0, len(s.models))
	index := make(map[string]int, len(s.models))
	for model, m := range s.models {
		index[model] = len(views)
		views = append(views, QueueView{Model: model, Depth: m.waiting, InFlight: m.inflight, Waiting: make([]WaitingView, 0, m.waiting)})
	}
	for _, w := range s.waiting {
		v := &views[index[w.req.Model]]
		v.Waiting = append(v.Waiting, WaitingView{
			ID:           w.req.ID,
			Position:     len(v.Waiting) + 1,
			EnqueuedAt:   w.since,
			WaitedMillis: float64(now.Sub(w.since)) / float64(time.Millisecond),
		})
	}
	slices.SortFunc(views, func(a, b QueueView) int { return strings.Compare(a.Model, b.Model) })
	return views
}

// Depths returns how many requests wait, by model (for metrics).
func (s *Scheduler) Depths() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.models))
	for model, m := range s.models {
		out[model] = m.waiting
	}
	return out
}

// InFlight returns every candidate provider with its capacity and the
// slots held on it, and the slots still held where there is no longer a
// candidate, sorted by node, generation and provider.
func (s *Scheduler) InFlight() []LoadView {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reevaluateLocked()
	var out []LoadView
	listed := make(map[providerKey]bool)
	for _, c := range s.cands {
		k := c.key()
		if listed[k] {
			continue
		}
		listed[k] = true
		out = append(out, LoadView{NodeID: c.NodeID, Generation: c.Generation, Provider: c.Provider, Adapter: c.Adapter,
			Capacity: c.Capacity, InFlight: s.inflight[k], Candidate: true})
	}
	for k, n := range s.inflight {
		if !listed[k] {
			out = append(out, LoadView{NodeID: k.node, Generation: k.gen, Provider: k.provider, InFlight: n})
		}
	}
	slices.SortFunc(out, func(a, b LoadView) int {
		return cmp.Or(strings.Compare(a.NodeID, b.NodeID), cmp.Compare(a.Generation, b.Generation), strings.Compare(a.Provider, b.Provider))
	})
	return out
}

// Candidates returns every place a request can run now: the online
// provider targets of ready, not suspect Node generations that are not
// marked unhealthy (R1, R6, P4), sorted by node, provider and target. It is
// the inventory the model lists show (SPEC P1): a model is listed exactly
// when a request for it can be scheduled, at once or behind busy capacity.
func (s *Scheduler) Candidates() []Candidate {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reevaluateLocked()
	out := make([]Candidate, len(s.cands))
	for i, c := range s.cands {
		out[i] = c.Candidate
	}
	return out
}
