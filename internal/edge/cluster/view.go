package cluster

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/fleet"
)

// View is the cluster as operators see it from any Edge: every Edge, and
// for every Node the Edges it is connected to.
type View struct {
	Now time.Time `json:"now"`
	// Self is the id of the Edge that answers.
	Self string `json:"self"`
	// Clustered: a cluster is configured; false for an Edge alone.
	Clustered bool `json:"clustered"`
	// Database is "reachable" or "unreachable" (then the other Edges and
	// their Nodes are as last read); empty for an Edge alone.
	Database string `json:"database,omitempty"`
	// Edges are every Edge with a row, dead ones too until they are
	// forgotten, sorted by id.
	Edges []EdgeView `json:"edges"`
	// ConfigAgreed: every alive Edge has the same configuration hash.
	ConfigAgreed bool `json:"config_agreed"`
	// Nodes are every Node connected to an alive Edge, sorted by id.
	Nodes []NodeEdges `json:"nodes"`
}

// EdgeView is one Edge in the view.
type EdgeView struct {
	Member
	// HeartbeatAgeMillis is how old its last heartbeat is.
	HeartbeatAgeMillis float64 `json:"heartbeat_age_ms"`
	// ConfigDiffers: its configuration hash is not the majority's of the
	// alive Edges (with no majority, every alive Edge differs while they
	// do not all agree).
	ConfigDiffers bool `json:"config_differs,omitempty"`
	// Nodes is how many Nodes are connected to it.
	Nodes int `json:"nodes"`
}

// NodeEdges is one Node and its connections, one per Edge.
type NodeEdges struct {
	ID    string     `json:"id"`
	Edges []NodeLink `json:"edges"`
}

// View returns the cluster view: the members last read, this Edge's Nodes
// from its registry, the other Edges' Nodes read now (or as last read,
// with the database unreachable).
func (c *Cluster) View(ctx context.Context) View {
	c.mu.Lock()
	members := slices.Clone(c.members)
	reachable := c.reachable
	c.mu.Unlock()
	alive := make(map[string]bool, len(members))
	for _, m := range members {
		alive[m.ID] = m.Alive
	}
	var links []NodeLink
	if reachable {
		ctx, cancel := context.WithTimeout(ctx, c.fresh)
		defer cancel()
		var err error
		if links, err = c.readNodes(ctx, alive); err != nil {
			reachable = false
		}
	} else {
		// Known unreachable: answer at once from what was last read; the
		// membership loop notices the database's return.
		links = c.lastNodes(alive)
	}
	if c.fleet != nil {
		links = append(links, linksOf(c.self.ID, c.fleet.Snapshot())...)
	}
	v := assemble(c.self.ID, members, links)
	v.Clustered, v.Database = true, "unreachable"
	if reachable {
		v.Database = "reachable"
	}
	return v
}

// assemble builds a view from members and links.
func assemble(self string, members []Member, links []NodeLink) View {
	v := View{Now: time.Now().UTC(), Self: self, Edges: make([]EdgeView, len(members)), Nodes: []NodeEdges{}}
	perEdge := map[string]int{}
	slices.SortFunc(links, compareLinks)
	for _, l := range links {
		perEdge[l.Edge]++
		if n := len(v.Nodes); n > 0 && v.Nodes[n-1].ID == l.Node {
			v.Nodes[n-1].Edges = append(v.Nodes[n-1].Edges, l)
			continue
		}
		v.Nodes = append(v.Nodes, NodeEdges{ID: l.Node, Edges: []NodeLink{l}})
	}
	majority, agreed := majorityHash(members)
	v.ConfigAgreed = agreed
	for i, m := range members {
		v.Edges[i] = EdgeView{
			Member: m, HeartbeatAgeMillis: float64(m.HeartbeatAge) / float64(time.Millisecond),
			ConfigDiffers: m.Alive && !agreed && m.ConfigHash != majority,
			Nodes:         perEdge[m.ID],
		}
	}
	return v
}

// majorityHash is the configuration hash most alive Edges have, "" when
// no hash has more Edges than every other; agreed when all have the same.
func majorityHash(members []Member) (majority string, agreed bool) {
	count := map[string]int{}
	for _, m := range members {
		if m.Alive {
			count[m.ConfigHash]++
		}
	}
	if len(count) <= 1 {
		return "", true
	}
	best, tie := 0, false
	for h, n := range count {
		switch {
		case n > best:
			majority, best, tie = h, n, false
		case n == best:
			tie = true
		}
	}
	if tie {
		return "", false
	}
	return majority, false
}

// Single is the cluster view of an Edge alone (no cluster configured):
// itself, its Nodes from its registry, and its usage in a ledger in memory
// since it started. The admin API, the status page and the metrics take it
// where a cluster would be.
type Single struct {
	self    Self
	fleet   *fleet.Registry
	ledger  *Ledger
	started time.Time

	mu       sync.Mutex
	stopping bool
	hash     string
}

// NewSingle returns the view of the Edge self alone, with its Nodes in
// reg (nil: none) and a ledger in memory of opts.MaxBuffered aggregates.
func NewSingle(self Self, reg *fleet.Registry, opts LedgerOptions) *Single {
	return &Single{self: self, fleet: reg, ledger: newLedger(nil, self.ID, opts, nil), started: time.Now(), hash: self.ConfigHash}
}

// Record adds one piece of work's usage to the in-memory ledger.
func (s *Single) Record(principal, model, node string, prompt, completion int64) {
	s.ledger.Record(principal, model, node, prompt, completion)
}

// MarkStopping shows this Edge as stopping.
func (s *Single) MarkStopping() {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
}

// SetConfigHash shows hash as this Edge's configuration hash.
func (s *Single) SetConfigHash(hash string) {
	s.mu.Lock()
	s.hash = hash
	s.mu.Unlock()
}

// Members is this Edge alone.
func (s *Single) Members() []Member {
	s.mu.Lock()
	defer s.mu.Unlock()
	return []Member{{
		ID: s.self.ID, QUICAddr: s.self.QUICAddr, HTTPAddr: s.self.HTTPAddr, Version: s.self.Version,
		ConfigHash: s.hash, StartedAt: s.started, HeartbeatAt: time.Now(), Stopping: s.stopping, Alive: true, Self: true,
	}}
}

// View is this Edge and its Nodes.
func (s *Single) View(context.Context) View {
	var links []NodeLink
	if s.fleet != nil {
		links = linksOf(s.self.ID, s.fleet.Snapshot())
	}
	return assemble(s.self.ID, s.Members(), links)
}

// Usage is this Edge's usage since it started, as far as its ledger in
// memory reaches back.
func (s *Single) Usage(_ context.Context, q UsageQuery) (UsageReport, error) {
	if err := q.Check(); err != nil {
		return UsageReport{}, err
	}
	groups := map[UsageDims]Counts{}
	s.ledger.local(q.From, q.To, dimsOf(q, s.self.ID), groups)
	return report(q, groups, "memory"), nil
}

// Stats are one alive member, no database.
func (s *Single) Stats() Stats { return Stats{Members: 1, Alive: 1} }

// PublishConfig shows the hash of cfg's shared sections (ConfigHash).
func (s *Single) PublishConfig(cfg *edgeconfig.Config) { s.SetConfigHash(ConfigHash(cfg)) }
