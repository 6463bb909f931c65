package fakeollama

import "sync/atomic"

// Concurrency is how many generation requests (/api/chat, /api/generate)
// the fake is answering at once: now, and the most ever (issue 22: a Node
// shared by several Edges never runs more than its capacity, counted where
// the work lands).
type Concurrency struct {
	Now int64 `json:"now"`
	Max int64 `json:"max"`
}

// meter counts generation requests in flight and their peak.
type meter struct{ now, peak atomic.Int64 }

// enter counts one more in flight, and returns its leave.
func (m *meter) enter() func() {
	n := m.now.Add(1)
	for {
		p := m.peak.Load()
		if n <= p || m.peak.CompareAndSwap(p, n) {
			break
		}
	}
	return func() { m.now.Add(-1) }
}

// Concurrency returns the generation requests in flight now and the most
// there ever were at once.
func (s *Server) Concurrency() Concurrency {
	return Concurrency{Now: s.gen.now.Load(), Max: s.gen.peak.Load()}
}
