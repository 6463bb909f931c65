package fleet

import (
	"errors"
	"fmt"
	"time"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The Edge's health overlay (R6, R7): per provider target of one
// generation, what stall observations and the Node's own reports say.
//
//   - provider_unhealthy takes the target out of selection; it comes back
//     when a later ProviderStatusUpdate, taken after that observation (its
//     health_observation_seq is not below the observation's), reports the
//     target without the unavailable mark: the Node re-probes it and
//     clears the mark when it answers.
//   - request_stalled counts against the target: among otherwise equal
//     candidates, one with fewer consecutive stalls is picked first. A
//     completed run resets the count.
//   - health_unknown is recorded and changes nothing.
//
// An observation is stale, and ignored, when its generation is fenced or
// not the connection's, or its sequence is not above the last one accepted
// on the connection.

// ErrStaleObservation is returned by ObserveStall for an observation that
// must be ignored; the error says why.
var ErrStaleObservation = errors.New("stale health observation")

type targetKey struct{ provider, target string }

// targetHealth is one target's overlay entry. Guarded by Registry.mu.
type targetHealth struct {
	unhealthy bool
	// seq is the observation sequence the unhealthy verdict stands on: an
	// update read before it cannot override it.
	seq       uint64
	stalls    uint64 // consecutive request_stalled observations
	lastClass string
	lastAt    time.Time
	// source is what made it unhealthy: a stall observation's probe, or
	// the Node's own report (an exact-target probe it ran).
	source string
}

// Sources of an unhealthy verdict, as the admin API names them.
const (
	SourceStallObservation = "stall_observation"
	SourceNodeReport       = "node_report"
)

func (c *Conn) healthLocked(k targetKey) *targetHealth {
	if c.health == nil {
		c.health = make(map[targetKey]*targetHealth)
	}
	h := c.health[k]
	if h == nil {
		h = &targetHealth{}
		c.health[k] = h
	}
	return h
}

// ObserveStall validates a stall observation that arrived on c and applies
// it to the overlay. A stale one returns an error wrapping
// ErrStaleObservation and changes nothing.
func (r *Registry) ObserveStall(c *Conn, o *wirepb.StallObservation) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	seq := o.GetHealthObservationSeq()
	switch {
	case c.state == Fenced || r.nodes[c.info.NodeID] != c:
		return fmt.Errorf("%w: generation %d of node %s is fenced", ErrStaleObservation, c.generation, c.info.NodeID)
	case o.GetGeneration() != c.generation || o.GetNodeId() != c.info.NodeID:
		return fmt.Errorf("%w: observation of %s generation %d arrived on %s generation %d",
			ErrStaleObservation, o.GetNodeId(), o.GetGeneration(), c.info.NodeID, c.generation)
	case seq <= c.lastObservation:
		return fmt.Errorf("%w: sequence %d is not above %d, the last seen from %s generation %d",
			ErrStaleObservation, seq, c.lastObservation, c.info.NodeID, c.generation)
	}
	c.lastObservation = seq
	h := c.healthLocked(targetKey{o.GetProvider(), o.GetTarget()})
	h.lastClass, h.lastAt = o.GetLivenessClassification(), r.now()
	switch o.GetLivenessClassification() {
	case quicwire.LivenessProviderUnhealthy:
		h.unhealthy, h.seq, h.source = true, seq, SourceStallObservation
	case quicwire.LivenessRequestStalled:
		h.stalls++
	default:
		return nil
	}
	r.notifyLocked()
	return nil
}

// ObserveCompleted records that a run on the target completed: its count
// of consecutive stalls starts again.
func (r *Registry) ObserveCompleted(c *Conn, provider, target string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h := c.health[targetKey{provider, target}]; h != nil && h.stalls > 0 {
		h.stalls = 0
		r.notifyLocked()
	}
}

// applyReportedHealthLocked takes the targets' health from providers the
// Node reported when its observation sequence was seq: an entry set by a
// later observation is kept. Callers hold r.mu.
func (c *Conn) applyReportedHealthLocked(providers []*wirepb.Provider, seq uint64) {
	for _, p := range providers {
		for _, t := range p.GetTargets() {
			k := targetKey{p.GetName(), t.GetName()}
			down := t.GetHealth() == quicwire.TargetHealthUnavailable
			h := c.health[k]
			if h == nil && !down {
				continue
			}
			if h != nil && h.unhealthy && h.seq > seq {
				continue // the update was read before the observation
			}
			h = c.healthLocked(k)
			h.unhealthy, h.seq, h.source = down, seq, ""
			if down {
				h.source = SourceNodeReport
			}
		}
	}
}

// TargetHealth is what the overlay says about one target.
type TargetHealth struct {
	// Unhealthy targets are out of selection.
	Unhealthy bool
	// Stalls is the number of consecutive request_stalled observations.
	Stalls uint64
}

// TargetHealth returns the overlay's entry for one target of c.
func (c *Conn) TargetHealth(provider, target string) TargetHealth {
	c.reg.mu.Lock()
	defer c.reg.mu.Unlock()
	h := c.health[targetKey{provider, target}]
	if h == nil {
		return TargetHealth{}
	}
	return TargetHealth{Unhealthy: h.unhealthy, Stalls: h.stalls}
}
