package fleet

import (
	"slices"
	"strings"
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// NodeView is one Node as the admin API shows it.
type NodeView struct {
	ID         string `json:"id"`
	Generation uint64 `json:"generation"`
	// State is the generation's state. A suspect generation keeps its
	// state (suspicion is not a fence): Dispatchable and Suspect say
	// whether it takes work now.
	State State `json:"state"`
	// Dispatchable: the generation takes new work now, ready (R1) and
	// not suspect (P4). A ready but suspect Node is not.
	Dispatchable bool              `json:"dispatchable"`
	Version      string            `json:"version,omitempty"`
	Identity     string            `json:"identity,omitempty"`
	RemoteAddr   string            `json:"remote_addr,omitempty"`
	ConnectedAt  time.Time         `json:"connected_at"`
	Labels       map[string]string `json:"labels,omitempty"`
	// LastHeartbeatRTTMillis is the round trip of the last answered
	// heartbeat the Edge sent, in milliseconds; absent before the first.
	LastHeartbeatRTTMillis *float64   `json:"last_heartbeat_rtt_ms,omitempty"`
	LastHeartbeatAt        *time.Time `json:"last_heartbeat_at,omitempty"`
	FenceReason            string     `json:"fence_reason,omitempty"`
	FenceDetail            string     `json:"fence_detail,omitempty"`
	FencedAt               *time.Time `json:"fenced_at,omitempty"`
	// Suspect: the Node has not been heard from at the transport level for
	// a few seconds; it gets no new work until a heartbeat sent after the
	// silence is answered (P4, issue 26). SilentSince is when it was last
	// heard from before the silence; SuspectSince when it became suspect;
	// SilentForMillis how long the silence has lasted (until HeardAgainAt,
	// once it was heard from again). HeardAgainAt: packets arrive again,
	// and the Edge waits for a heartbeat's answer before it sends work.
	Suspect         bool           `json:"suspect,omitempty"`
	SilentSince     *time.Time     `json:"silent_since,omitempty"`
	SuspectSince    *time.Time     `json:"suspect_since,omitempty"`
	SilentForMillis *float64       `json:"silent_for_ms,omitempty"`
	HeardAgainAt    *time.Time     `json:"heard_again_at,omitempty"`
	Providers       []ProviderView `json:"providers"`
}

// ProviderView is one provider of a Node.
type ProviderView struct {
	Name         string   `json:"name"`
	Adapter      string   `json:"adapter"`
	State        string   `json:"state"`
	Capacity     uint32   `json:"capacity"`
	Targets      []string `json:"targets"`
	Capabilities []string `json:"capabilities,omitempty"`
	Detail       string   `json:"detail,omitempty"`
	// UnhealthyTargets are out of selection: a stall's probe found them
	// unavailable and the Node has not reported them back yet (R6).
	UnhealthyTargets []string `json:"unhealthy_targets,omitempty"`
	// Stalls counts each target's consecutive request_stalled
	// observations; a completed run resets it.
	Stalls map[string]uint64 `json:"stalls,omitempty"`
	// Evidence is what the overlay holds about each target it has an
	// entry for: why an unhealthy one is out of selection, and the last
	// stall observation.
	Evidence map[string]TargetEvidence `json:"evidence,omitempty"`
	// Loaded is what the provider's server holds loaded (loaded.go);
	// absent when its Node does not say.
	Loaded *LoadedView `json:"loaded,omitempty"`
}

// TargetEvidence is the health overlay's entry for one target (R6, R7).
type TargetEvidence struct {
	Unhealthy bool `json:"unhealthy"`
	// Source is what made it unhealthy: SourceStallObservation or
	// SourceNodeReport; empty while it is not.
	Source string `json:"source,omitempty"`
	// ObservationSeq is the health_observation_seq the verdict stands on.
	ObservationSeq uint64 `json:"observation_seq,omitempty"`
	// LastClassification and LastObservedAt are the last stall
	// observation's liveness classification and when the Edge took it.
	LastClassification string     `json:"last_classification,omitempty"`
	LastObservedAt     *time.Time `json:"last_observed_at,omitempty"`
	Stalls             uint64     `json:"stalls,omitempty"`
}

// Snapshot returns every known Node, sorted by id. Fenced Nodes that have
// not come back within the retention period are forgotten here.
func (r *Registry) Snapshot() []NodeView {
	r.mu.Lock()
	now := r.now()
	conns := make([]*Conn, 0, len(r.nodes))
	for id, c := range r.nodes {
		if c.state == Fenced && now.Sub(c.fencedAt) > r.retention {
			delete(r.nodes, id)
			continue
		}
		conns = append(conns, c)
	}
	views := make([]NodeView, 0, len(conns))
	for _, c := range conns {
		v := NodeView{
			ID:          c.info.NodeID,
			Generation:  c.generation,
			State:       c.state,
			Version:     c.info.Version,
			Identity:    c.info.Identity,
			RemoteAddr:  c.info.RemoteAddr,
			ConnectedAt: c.connectedAt,
			Labels:      c.info.Labels,
			Providers:   providerViews(c.providers, c.health),
		}
		v.Dispatchable = c.state == Ready && c.suspectSince.IsZero()
		if !c.suspectSince.IsZero() && c.state != Fenced {
			silent, since := c.silentSince, c.suspectSince
			v.Suspect, v.SilentSince, v.SuspectSince = true, &silent, &since
			end := now
			if !c.heardAt.IsZero() {
				heard := c.heardAt
				v.HeardAgainAt, end = &heard, heard
			}
			ms := float64(end.Sub(silent)) / float64(time.Millisecond)
			v.SilentForMillis = &ms
		}
		if c.state == Fenced {
			// A fenced generation's providers are offline (R9).
			for j := range v.Providers {
				v.Providers[j].State = "offline"
			}
			v.FenceReason = c.fenceCode.String()
			v.FenceDetail = c.fenceDetail
			at := c.fencedAt
			v.FencedAt = &at
		}
		views = append(views, v)
	}
	r.mu.Unlock()
	// RTT reads the heartbeat's own lock: outside the registry lock.
	for i, c := range conns {
		if c.info.Link == nil {
			continue
		}
		if rtt, at := c.info.Link.RTT(); !at.IsZero() {
			ms := float64(rtt) / float64(time.Millisecond)
			views[i].LastHeartbeatRTTMillis = &ms
			views[i].LastHeartbeatAt = &at
		}
	}
	slices.SortFunc(views, func(a, b NodeView) int { return strings.Compare(a.ID, b.ID) })
	return views
}

func providerViews(ps []*wirepb.Provider, health map[targetKey]*targetHealth) []ProviderView {
	out := make([]ProviderView, 0, len(ps))
	for _, p := range ps {
		v := ProviderView{
			Name:         p.GetName(),
			Adapter:      p.GetAdapter(),
			State:        providerState(p.GetState()),
			Capacity:     p.GetCapacity(),
			Targets:      make([]string, 0, len(p.GetTargets())),
			Capabilities: p.GetCapabilities(),
			Detail:       p.GetDetail(),
			Loaded:       loadedView(p),
		}
		for _, t := range p.GetTargets() {
			v.Targets = append(v.Targets, t.GetName())
			h := health[targetKey{p.GetName(), t.GetName()}]
			if h == nil {
				continue
			}
			if h.unhealthy {
				v.UnhealthyTargets = append(v.UnhealthyTargets, t.GetName())
			}
			if h.stalls > 0 {
				if v.Stalls == nil {
					v.Stalls = make(map[string]uint64)
				}
				v.Stalls[t.GetName()] = h.stalls
			}
			ev := TargetEvidence{Unhealthy: h.unhealthy, Source: h.source, LastClassification: h.lastClass, Stalls: h.stalls}
			if h.unhealthy {
				ev.ObservationSeq = h.seq
			}
			if !h.lastAt.IsZero() {
				at := h.lastAt
				ev.LastObservedAt = &at
			}
			if !h.unhealthy && h.stalls == 0 && h.lastClass == "" {
				continue // an entry cleared: nothing to show
			}
			if v.Evidence == nil {
				v.Evidence = make(map[string]TargetEvidence)
			}
			v.Evidence[t.GetName()] = ev
		}
		out = append(out, v)
	}
	return out
}

func providerState(s wirepb.ProviderState) string {
	switch s {
	case wirepb.ProviderState_PROVIDER_STATE_STARTING:
		return "starting"
	case wirepb.ProviderState_PROVIDER_STATE_ONLINE:
		return "online"
	case wirepb.ProviderState_PROVIDER_STATE_OFFLINE:
		return "offline"
	}
	return "unknown"
}
