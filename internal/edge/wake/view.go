package wake

import (
	"maps"
	"slices"
	"time"
)

// NodeView is one Node the Edge can wake, as the admin API
// (/admin/v1/wake) and the status page show it.
type NodeView struct {
	Node  string `json:"node"`
	State State  `json:"state"`
	// Models are the targets it served when last connected.
	Models []string `json:"models"`
	// Wakers are the Nodes that list it, and whether each is connected
	// (ready) now.
	Wakers []WakerView `json:"wakers"`
	// While waking: since when, for which model, through which waker,
	// and how many packets were sent.
	WakingSince *time.Time `json:"waking_since,omitempty"`
	WakingFor   string     `json:"waking_for,omitempty"`
	Via         string     `json:"via,omitempty"`
	Packets     int        `json:"packets,omitempty"`
	// The last wake that succeeded: when, how long it took, through whom;
	// and when the last one timed out.
	LastWokeAt     *time.Time `json:"last_woke_at,omitempty"`
	LastWakeMillis int64      `json:"last_wake_ms,omitempty"`
	LastVia        string     `json:"last_via,omitempty"`
	LastTimedOutAt *time.Time `json:"last_timed_out_at,omitempty"`
}

// WakerView is a Node that can wake another.
type WakerView struct {
	Node      string `json:"node"`
	Connected bool   `json:"connected"`
}

// Snapshot lists every Node some Node can wake, by id.
func (t *Tracker) Snapshot() []NodeView {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := []NodeView{}
	for _, id := range slices.Sorted(maps.Keys(t.nodes)) {
		n := t.nodes[id]
		if len(n.wakers) == 0 {
			continue
		}
		v := NodeView{Node: id, State: Sleeping, Models: []string{}, Wakers: []WakerView{}}
		for _, o := range n.offers {
			if !slices.Contains(v.Models, o.Target) {
				v.Models = append(v.Models, o.Target)
			}
		}
		slices.Sort(v.Models)
		for _, w := range slices.Sorted(maps.Keys(n.wakers)) {
			v.Wakers = append(v.Wakers, WakerView{Node: w, Connected: t.connectedLocked(w)})
		}
		switch {
		case n.ready:
			v.State = Awake
		case n.wake != nil:
			a := n.wake
			since := a.started
			v.State, v.WakingSince, v.WakingFor, v.Via, v.Packets = Waking, &since, a.model, a.via, a.sends
		}
		if !n.lastWoke.IsZero() {
			at := n.lastWoke
			v.LastWokeAt, v.LastWakeMillis, v.LastVia = &at, n.lastTook.Milliseconds(), n.lastVia
		}
		if !n.lastTimedOut.IsZero() {
			at := n.lastTimedOut
			v.LastTimedOutAt = &at
		}
		out = append(out, v)
	}
	return out
}
