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

// Matching returns the candidates now that match admits, in Candidates'
// order (nil when none does): the list filtered where it is, so that a
// request asking what serves its model copies that, not the whole fleet's
// list. match runs with the scheduler locked: it must not call the
// scheduler.
func (s *Scheduler) Matching(match func(Candidate) bool) []Candidate {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reevaluateLocked()
	var out []Candidate
	for i := range s.cands {
		if match(s.cands[i].Candidate) {
			out = append(out, s.cands[i].Candidate)
		}
	}
	return out
}

// Any reports whether a candidate now is one match admits, copying none.
// match runs with the scheduler locked, as Matching's.
func (s *Scheduler) Any(match func(Candidate) bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reevaluateLocked()
	for i := range s.cands {
		if match(s.cands[i].Candidate) {
			return true
		}
	}
	return false
}

// ModelView is one model as the status page shows it: where it is served
// now, how much of that capacity is free, and its queue.
type ModelView struct {
	// Model is a target the candidates serve, or a model requests wait for
	// that names none of them (a route's name, or one no Node serves now).
	Model string `json:"model"`
	// Serving are the candidates that serve it now, by node and provider.
	Serving []ServingView `json:"serving"`
	// Capacity and InFlight sum the providers in Serving: a provider's
	// capacity is shared by all its targets, so its slots held for other
	// models count here too. Free is what is left of it.
	Capacity int `json:"capacity"`
	InFlight int `json:"in_flight"`
	Free     int `json:"free"`
	// QueueDepth is how many requests wait for it; OldestWaitMillis is how
	// long the first in line has waited (0 when none waits).
	QueueDepth       int     `json:"queue_depth"`
	OldestWaitMillis float64 `json:"oldest_wait_ms"`
}

// ServingView is one provider of one Node generation serving a model.
type ServingView struct {
	NodeID     string `json:"node"`
	Generation uint64 `json:"generation"`
	Provider   string `json:"provider"`
	Adapter    string `json:"adapter"`
	Capacity   int    `json:"capacity"`
	InFlight   int    `json:"in_flight"`
}

// Models returns every model served now or waited for, sorted by name. A
// queue is shown under the target it names (Ollama's implicit ":latest"
// included) when there is exactly one such target, and on its own
// otherwise.
func (s *Scheduler) Models() []ModelView {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reevaluateLocked()
	now := s.now()
	byName := make(map[string]*ModelView)
	get := func(name string) *ModelView {
		m := byName[name]
		if m == nil {
			m = &ModelView{Model: name, Serving: []ServingView{}}
			byName[name] = m
		}
		return m
	}
	for _, c := range s.cands {
		m := get(c.Target)
		n := s.inflight[c.key()]
		m.Serving = append(m.Serving, ServingView{NodeID: c.NodeID, Generation: c.Generation, Provider: c.Provider,
			Adapter: c.Adapter, Capacity: c.Capacity, InFlight: n})
		m.Capacity += c.Capacity
		m.InFlight += n
		m.Free += max(0, c.Capacity-n)
	}
	// s.waiting is in arrival order: the first waiter seen for a model is
	// its oldest.
	for _, w := range s.waiting {
		name := w.req.Model
		if _, ok := byName[name]; !ok {
			if target, ok := onlyTarget(byName, name); ok {
				name = target
			}
		}
		m := get(name)
		if m.QueueDepth == 0 {
			m.OldestWaitMillis = float64(now.Sub(w.since)) / float64(time.Millisecond)
		}
		m.QueueDepth++
	}
	out := make([]ModelView, 0, len(byName))
	for _, m := range byName {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b ModelView) int { return strings.Compare(a.Model, b.Model) })
	return out
}

// onlyTarget returns the one model of byName that serves what a client
// named model asked for, if exactly one does.
func onlyTarget(byName map[string]*ModelView, model string) (string, bool) {
	found := ""
	for target := range byName {
		if SameModel(target, model) {
			if found != "" {
				return "", false
			}
			found = target
		}
	}
	return found, found != ""
}
