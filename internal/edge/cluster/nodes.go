package cluster

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/iop-dev/iop/internal/edge/fleet"
)

// NodeLink is one Node's connection to one Edge.
type NodeLink struct {
	Node string `json:"node"`
	Edge string `json:"edge"`
	// Generation and State are the connection's on that Edge (fleet):
	// registering, ready or draining. A fenced connection is no link.
	Generation uint64      `json:"generation"`
	State      fleet.State `json:"state"`
	// Suspect: that Edge has not heard from the Node for a few seconds
	// (P4) and gives it no new work.
	Suspect bool `json:"suspect,omitempty"`
	// Since is when the connection was accepted.
	Since time.Time `json:"since"`
}

// linksOf are the links of the Nodes of one Edge's registry, sorted by
// Node: every connection not fenced.
func linksOf(edge string, nodes []fleet.NodeView) []NodeLink {
	out := make([]NodeLink, 0, len(nodes))
	for _, n := range nodes {
		if n.State == fleet.Fenced {
			continue
		}
		out = append(out, NodeLink{Node: n.ID, Edge: edge, Generation: n.Generation, State: n.State, Suspect: n.Suspect, Since: n.ConnectedAt.UTC()})
	}
	slices.SortFunc(out, compareLinks)
	return out
}

func compareLinks(a, b NodeLink) int {
	return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.Edge, b.Edge))
}

// runNodes keeps this Edge's rows of iop_edge_nodes equal to its registry:
// on a change, at most one write per NodesBatch, so that a burst of
// registrations is one write; and again every NodesResync, or when the
// session comes back, in case another Edge removed them.
func (c *Cluster) runNodes(ctx context.Context) {
	var written []NodeLink
	current := false // written is what the table holds
	var last time.Time
	resync := time.NewTicker(c.nodesResync)
	defer resync.Stop()
	for {
		changed := c.fleet.Changed()
		links := linksOf(c.self.ID, c.fleet.Snapshot())
		c.mu.Lock()
		held := c.held
		c.mu.Unlock()
		if held && (!current || !slices.Equal(links, written)) {
			err := c.writeNodes(ctx, links)
			c.setReachable(err)
			written, current, last = links, err == nil, time.Now()
		}
		var retry <-chan time.Time
		var t *time.Timer
		if !current {
			t = time.NewTimer(c.heartbeat)
			retry = t.C
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-retry:
		case <-resync.C:
			current = false
		case <-c.resyncNodes:
			current = false
		}
		if t != nil {
			t.Stop()
		}
		if wait := c.nodesBatch - time.Since(last); wait > 0 && !sleep(ctx, wait) {
			return
		}
	}
}

// writeNodes makes this Edge's rows links, in one transaction.
func (c *Cluster) writeNodes(ctx context.Context, links []NodeLink) error {
	ctx, cancel := context.WithTimeout(ctx, c.fresh)
	defer cancel()
	nodes := make([]string, len(links))
	gens := make([]int64, len(links))
	states := make([]string, len(links))
	suspect := make([]bool, len(links))
	since := make([]time.Time, len(links))
	for i, l := range links {
		nodes[i], gens[i], states[i], suspect[i], since[i] = l.Node, int64(l.Generation), string(l.State), l.Suspect, l.Since
	}
	b := &pgx.Batch{}
	b.Queue(`DELETE FROM iop_edge_nodes WHERE edge_id = $1 AND NOT (node_id = ANY($2))`, c.self.ID, nodes)
	b.Queue(`INSERT INTO iop_edge_nodes (edge_id, node_id, generation, state, suspect, since)
		SELECT $1, n, g, s, x, t FROM unnest($2::text[], $3::int8[], $4::text[], $5::bool[], $6::timestamptz[]) AS u(n, g, s, x, t)
		ON CONFLICT (edge_id, node_id) DO UPDATE SET generation = excluded.generation, state = excluded.state,
			suspect = excluded.suspect, since = excluded.since`,
		c.self.ID, nodes, gens, states, suspect, since)
	// A batch runs in one implicit transaction: the others never read a
	// half-written set.
	c.nodeWrites.Add(1)
	return c.pool.SendBatch(ctx, b).Close()
}

// readNodes reads the links of the other alive Edges. On failure it
// returns the links last read (fail static) and the error.
func (c *Cluster) readNodes(ctx context.Context, alive map[string]bool) ([]NodeLink, error) {
	rows, err := c.pool.Query(ctx, `SELECT node_id, edge_id, generation, state, suspect, since FROM iop_edge_nodes WHERE edge_id <> $1`, c.self.ID)
	var links []NodeLink
	if err == nil {
		links, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (NodeLink, error) {
			var l NodeLink
			var gen int64
			var state string
			err := row.Scan(&l.Node, &l.Edge, &gen, &state, &l.Suspect, &l.Since)
			l.Generation, l.State = uint64(gen), fleet.State(state)
			return l, err
		})
	}
	c.setReachable(err)
	if err == nil {
		c.mu.Lock()
		c.others = links
		c.mu.Unlock()
	}
	return c.lastNodes(alive), err
}

// lastNodes are the links of the other Edges last read, of the Edges alive
// only: a dead Edge's rows say nothing of where its Nodes are connected.
func (c *Cluster) lastNodes(alive map[string]bool) []NodeLink {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]NodeLink, 0, len(c.others))
	for _, l := range c.others {
		if alive[l.Edge] {
			out = append(out, l)
		}
	}
	return out
}
