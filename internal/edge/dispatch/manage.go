package dispatch

import (
	"bytes"
	"context"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Model management through the Edge (issue 23): an admin's pull, delete,
// copy or create goes to one provider of each Node it names, as a
// management tunnel (TunnelRequest.management). Such a tunnel is unlike a
// client's: it is for that Node's server and no other (no candidate is
// chosen, none is tried after a refusal), it takes no capacity slot and no
// lease (it runs no model), and it has no hard deadline: a pull of a large
// model takes as long as the download, and a silent server is ended by the
// Node's stall watchdog (ManageStallTimeout) while a client that goes away
// cancels it.

// ManageStallTimeout is the response-stall timeout of a management tunnel
// (R4): a pull's progress comes several times a second while it downloads,
// but checking the digest of a large blob, or a create that quantizes,
// is silent for minutes.
const ManageStallTimeout = 10 * 60 * 1000 // ms

// ManagedNode is a Node as model management sees it: its labels, its
// online providers of one adapter with the targets they list, and whether
// it takes a call now.
type ManagedNode struct {
	ID     string
	Labels map[string]string
	// Providers are its online providers of the adapter.
	Providers []ManagedProvider
	// Unavailable says why the Node takes no call now (not ready,
	// suspect, fenced); "" when it does.
	Unavailable string
}

// ManagedProvider is one online provider of a Node and the targets it
// lists.
type ManagedProvider struct {
	Name    string
	Targets []string
}

// nodeViews is what Nodes tells of every Node the Edge knows (ServerNodes,
// through its registry).
type nodeViews interface{ Snapshot() []fleet.NodeView }

func (n serverNodes) Snapshot() []fleet.NodeView { return n.srv.Registry().Snapshot() }

// ManagedNodes lists every Node the Edge knows, sorted by id, with its
// online providers of adapter: where a management call can go.
func (d *Dispatcher) ManagedNodes(adapter string) []ManagedNode {
	views, ok := d.nodes.(nodeViews)
	if !ok {
		return nil
	}
	var out []ManagedNode
	for _, v := range views.Snapshot() {
		n := ManagedNode{ID: v.ID, Labels: v.Labels}
		switch {
		case v.State == fleet.Fenced:
			n.Unavailable = "not connected (its connection ended: " + v.FenceReason + ")"
		case v.Suspect:
			n.Unavailable = "suspect: not heard from for a few seconds"
		case !v.Dispatchable:
			n.Unavailable = "not ready (" + string(v.State) + ")"
		}
		for _, p := range v.Providers {
			if p.Adapter == adapter && p.State == "online" {
				n.Providers = append(n.Providers, ManagedProvider{Name: p.Name, Targets: p.Targets})
			}
		}
		out = append(out, n)
	}
	return out
}

// Manage opens a management tunnel of req, with body, to provider on
// nodeID: no slot, no lease, no deadline, the stall timeout
// ManageStallTimeout. req's id, provider, flags and timers are set here.
// The stream is the caller's to read to its end and Close.
func (d *Dispatcher) Manage(ctx context.Context, nodeID, provider string, req *wirepb.TunnelRequest, body []byte) (TunnelStream, error) {
	req.TunnelId = d.newID("mgmt")
	req.Provider, req.Target = provider, ""
	req.Management, req.Metadata = true, false
	req.DeadlineUnixMs, req.ResponseStallTimeoutMs = 0, ManageStallTimeout
	req.SealedLease, req.Binding = nil, nil
	setContentLength(req, len(body))
	return d.nodes.Tunnel(ctx, nodeID, req, bytes.NewReader(body))
}
