package transport

import (
	"sync/atomic"
	"time"
)

// Session is the state one side keeps for one connection: who the peer is,
// the connection's generation, and the health_observation_seq source (R7).
// A new connection gets a new Session, so its sequence starts again.
type Session struct {
	nodeID      string
	generation  uint64
	connectedAt time.Time
	healthSeq   atomic.Uint64
}

// NewSession returns the session of one connection of nodeID with the
// generation the Edge assigned to it.
func NewSession(nodeID string, generation uint64, connectedAt time.Time) *Session {
	return &Session{nodeID: nodeID, generation: generation, connectedAt: connectedAt}
}

// NodeID is the Node the connection belongs to.
func (s *Session) NodeID() string { return s.nodeID }

// Generation is the connection's generation, assigned by the Edge at
// registration (R9).
func (s *Session) Generation() uint64 { return s.generation }

// ConnectedAt is when the connection registered.
func (s *Session) ConnectedAt() time.Time { return s.connectedAt }

// NextHealthObservationSeq takes the next health_observation_seq (R7). The
// source starts at 0, so the first observation of a connection is 1; values
// are unique and increasing across goroutines, shared by runs and tunnels.
func (s *Session) NextHealthObservationSeq() uint64 { return s.healthSeq.Add(1) }

// HealthObservationSeq is the last value taken, 0 if none.
func (s *Session) HealthObservationSeq() uint64 { return s.healthSeq.Load() }
