// Package cluster is what the Edges of one cluster know of each other
// through their shared PostgreSQL database (issue 22, SPEC P8): which Edges
// are alive (membership), whether their configuration files agree, which
// Edges each Node is connected to, and the usage ledger; and the one view of
// all of it that operators read from any Edge.
//
// There is no consensus among the Edges and no Edge-to-Edge traffic: each
// Edge writes its own rows and reads everyone's.
//
// Membership. An Edge upserts its row of iop_edges when it starts and
// heartbeats it every second. It also holds, on a connection of its own, a
// session-level advisory lock keyed by its id: PostgreSQL releases it the
// moment that connection closes, which the kernel does for a process killed
// with kill -9. Every Edge reads the table and pg_locks every second (and at
// once on a NOTIFY, sent on join, stop, leave and a configuration change): an
// Edge is alive while it holds its lock and its heartbeat is fresh (5 s), so
// a killed Edge is dropped within about a second, a hung one within five.
// The lock also keeps two processes from being the same Edge.
//
// Failure semantics. With the database unreachable an Edge keeps what it
// last knew (fail static): its member list, the Nodes of the others, and its
// usage, which the ledger buffers up to a bound (ledger.go). It logs the
// loss once and the recovery once, and catches up when the database is back.
// Its own Nodes and its own row are always shown from memory.
package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/inflight"
)

// Defaults of Options.
const (
	// DefaultHeartbeat is how often an Edge heartbeats its row and reads
	// the others'.
	DefaultHeartbeat = time.Second
	// DefaultFresh is how old a heartbeat may be for its Edge to count as
	// alive: a hung Edge whose connection stays open is dropped after it.
	DefaultFresh = 5 * time.Second
	// DefaultForget is how long the row of a dead Edge stays in the view
	// before any Edge deletes it.
	DefaultForget = time.Hour
	// DefaultNodesBatch is the least time between two writes of an Edge's
	// Nodes: changes in between go out together.
	DefaultNodesBatch = 500 * time.Millisecond
	// DefaultNodesResync is how often an Edge rewrites its Nodes even
	// without a change, in case another Edge removed them (it thought this
	// one dead during a blip of its connection).
	DefaultNodesResync = 10 * time.Second
)

// Self is what an Edge publishes of itself.
type Self struct {
	// ID is the Edge's edge_id: unique in the cluster.
	ID string
	// QUICAddr is where Nodes dial this Edge (cluster.advertise_quic).
	QUICAddr string
	// HTTPAddr is its client API as operators reach it
	// (cluster.advertise_http).
	HTTPAddr string
	// Version is edged's version.
	Version string
	// ConfigHash is the hash of its shared configuration (ConfigHash);
	// SetConfigHash changes it after a reload.
	ConfigHash string
}

// Options configure a Cluster.
type Options struct {
	Self Self
	// Fleet is this Edge's registry of Nodes, published to iop_edge_nodes
	// and shown in the view; nil publishes no Nodes.
	Fleet *fleet.Registry
	// Logger logs the database's loss and return, and the Edges that join
	// and leave; nil logs nothing.
	Logger *slog.Logger
	// Heartbeat, Fresh, Forget, NodesBatch and NodesResync default to the
	// constants of the same names.
	Heartbeat, Fresh, Forget time.Duration
	NodesBatch, NodesResync  time.Duration
	// Ledger configures the usage ledger.
	Ledger LedgerOptions
}

// Cluster is one Edge's membership of a cluster: it publishes the Edge and
// its Nodes, follows the other Edges, and keeps the usage ledger. Create it
// with New, then Start; Stop leaves the cluster.
type Cluster struct {
	pool   *pgxpool.Pool
	self   Self
	fleet  *fleet.Registry
	log    *slog.Logger
	ledger *Ledger

	heartbeat, fresh, forget time.Duration
	nodesBatch, nodesResync  time.Duration

	// wake asks the membership loop to read the table now (a NOTIFY
	// arrived, or this Edge changed its own row).
	wake chan struct{}
	// resyncNodes asks the Nodes loop to rewrite this Edge's Nodes now
	// (its session came back: another Edge may have removed them).
	resyncNodes chan struct{}

	mu sync.Mutex
	// members is the last list read, sorted by id, this Edge included.
	members []Member
	changed chan struct{}
	// stopping and configHash are this Edge's own state, written to its
	// row by the next heartbeat; dirty: they changed since it was last
	// written, and the other Edges are to be told.
	stopping   bool
	configHash string
	dirty      bool
	// started is when this Edge started; lastBeat when its row was last
	// written.
	started, lastBeat time.Time
	// held: this process holds the Edge's advisory lock now.
	held bool
	// reachable is whether the last database call succeeded;
	// unreachableSince when it stopped doing so.
	reachable        bool
	unreachableSince time.Time
	// settleUntil ends the settling after the database came back: until
	// then an Edge alive before is not declared dead for a stale heartbeat
	// or a missing lock, since every Edge is reconnecting and its
	// heartbeat is as old as the outage.
	settleUntil time.Time
	// others are the Node connections of the other alive Edges, as last
	// read.
	others []NodeLink
	// cleaned are the dead Edges whose Node rows this Edge removed.
	cleaned map[string]bool

	// sess is the session connection: the Edge's lock and LISTEN.
	sess session
	// nodeWrites counts the writes of this Edge's Nodes (for tests of the
	// batching).
	nodeWrites atomic.Uint64

	// cancel ends the loops but the session's; cancelSession the
	// session's, which closes sessionDone when it returns.
	cancel, cancelSession context.CancelFunc
	sessionDone           chan struct{}
	wg                    sync.WaitGroup
	// kill ends the loops without leaving: tests use it for kill -9.
	killed bool
}

// ErrNoID is New's error for a Self without an id.
var ErrNoID = errors.New("cluster: the Edge has no id")

// New returns the cluster membership of opts.Self over pool (see
// clusterdb.Open). It does nothing until Start.
func New(pool *pgxpool.Pool, opts Options) (*Cluster, error) {
	if opts.Self.ID == "" {
		return nil, ErrNoID
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{
		pool: pool, self: opts.Self, fleet: opts.Fleet, log: log,
		heartbeat:   cmp.Or(opts.Heartbeat, DefaultHeartbeat),
		fresh:       cmp.Or(opts.Fresh, DefaultFresh),
		forget:      cmp.Or(opts.Forget, DefaultForget),
		nodesBatch:  cmp.Or(opts.NodesBatch, DefaultNodesBatch),
		nodesResync: cmp.Or(opts.NodesResync, DefaultNodesResync),
		wake:        make(chan struct{}, 1),
		resyncNodes: make(chan struct{}, 1),
		changed:     make(chan struct{}),
		configHash:  opts.Self.ConfigHash,
		started:     time.Now(),
		reachable:   true,
		cleaned:     make(map[string]bool),
	}
	c.members = []Member{c.selfMember()}
	c.ledger = newLedger(pool, opts.Self.ID, opts.Ledger, log)
	c.ledger.reached = c.setReachable
	return c, nil
}

// Start creates or updates the cluster's tables (Migrate) and starts
// following the cluster: this Edge's row and lock, its heartbeat, the other
// Edges, its Nodes and the ledger's writes. It fails when the tables cannot
// be made; once started, a database that goes away is waited for (fail
// static).
func (c *Cluster) Start(ctx context.Context) error {
	if err := Migrate(ctx, c.pool); err != nil {
		return err
	}
	// The session outlives the other loops at Stop: the Edge holds its
	// lock until it has left.
	sessCtx, sessCancel := context.WithCancel(context.Background())
	run, cancel := context.WithCancel(context.Background())
	c.cancelSession, c.cancel = sessCancel, cancel
	c.sessionDone = make(chan struct{})
	go func() { defer close(c.sessionDone); c.runSession(sessCtx) }()
	c.wg.Add(2)
	go func() { defer c.wg.Done(); c.runMembership(run) }()
	go func() { defer c.wg.Done(); c.ledger.run(run) }()
	if c.fleet != nil {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); c.runNodes(run) }()
	}
	return nil
}

// Stop leaves the cluster: it writes the ledger's buffer, removes this
// Edge's Nodes and row (the others see it leave at once, by NOTIFY), and
// then releases its lock. ctx bounds the writes; what the ledger could not
// write by then is lost, and logged.
func (c *Cluster) Stop(ctx context.Context) error {
	if c.cancel == nil {
		return nil
	}
	c.cancel()
	c.wg.Wait()
	c.cancel = nil
	var err error
	if !c.killed {
		err = c.ledger.write(ctx)
		if n := c.ledger.Buffered(); n > 0 {
			c.log.Warn("cluster: usage not written to the ledger at stop", "aggregates", n, "err", err)
		}
		if lerr := c.leave(ctx); lerr != nil {
			err = errors.Join(err, lerr)
		}
	}
	c.cancelSession()
	<-c.sessionDone
	return err
}

// leave deletes this Edge's Nodes and row and tells the others.
func (c *Cluster) leave(ctx context.Context) error {
	b := &pgx.Batch{}
	b.Queue(`DELETE FROM iop_edge_nodes WHERE edge_id = $1`, c.self.ID)
	b.Queue(`DELETE FROM iop_edges WHERE edge_id = $1`, c.self.ID)
	b.Queue(`SELECT pg_notify($1, $2)`, notifyChannel, "leave:"+c.self.ID)
	if err := c.pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("cluster: leave: %w", err)
	}
	return nil
}

// Membership is what an Edge's wiring holds of its cluster, whichever it
// is: *Cluster, or *Single for an Edge alone. The admin reads, the status
// page and the metrics show either the same way.
type Membership interface {
	// Members are the Edges alive now, this one included.
	Members() []Member
	// View is every Edge and every Node's Edges, for the admin reads.
	View(ctx context.Context) View
	// Usage is the usage ledger's totals over a window.
	Usage(ctx context.Context, q UsageQuery) (UsageReport, error)
	// Stats are the figures of the metrics.
	Stats() Stats
	// Record takes one piece of work's usage (inflight.Options.Usage).
	Record(principal, model, node string, promptTokens, completionTokens int64)
	// MarkStopping shows this Edge as stopping (draining).
	MarkStopping()
	// PublishConfig shows the hash of the configuration's shared sections;
	// call it at start and after each applied reload.
	PublishConfig(cfg *edgeconfig.Config)
}

var (
	_ Membership = (*Cluster)(nil)
	_ Membership = (*Single)(nil)
)

// The ledger takes the usage of every piece of work as it ends
// (inflight.Options.Usage), an Edge alone's as well as a cluster's.
var (
	_ inflight.UsageRecorder = (*Cluster)(nil)
	_ inflight.UsageRecorder = (*Single)(nil)
	_ inflight.UsageRecorder = (*Ledger)(nil)
)

// Ledger is the usage ledger this Edge writes.
func (c *Cluster) Ledger() *Ledger { return c.ledger }

// Record adds one piece of work's usage to the ledger (Ledger.Record).
func (c *Cluster) Record(principal, model, node string, prompt, completion int64) {
	c.ledger.Record(principal, model, node, prompt, completion)
}

// Stats are the figures of the cluster's metrics.
type Stats struct {
	// Clustered: a cluster is configured (false for Single).
	Clustered bool
	// Members is how many Edges the cluster view shows; Alive how many of
	// them are alive (this one included).
	Members, Alive int
	// DatabaseReachable: the last database call succeeded.
	DatabaseReachable bool
	// LedgerBuffered is how many usage aggregates wait to be written;
	// LedgerDropped how many were dropped past the buffer's bound.
	LedgerBuffered int
	LedgerDropped  uint64
}

// Stats returns the cluster's figures now.
func (c *Cluster) Stats() Stats {
	c.mu.Lock()
	s := Stats{Clustered: true, Members: len(c.members), DatabaseReachable: c.reachable}
	for _, m := range c.members {
		if m.Alive {
			s.Alive++
		}
	}
	c.mu.Unlock()
	s.LedgerBuffered, s.LedgerDropped = c.ledger.Buffered(), c.ledger.Dropped()
	return s
}

// setReachable records the outcome of a database call, logging the loss of
// the database once and its return once.
func (c *Cluster) setReachable(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err == nil && !c.reachable:
		c.reachable = true
		c.settleUntil = time.Now().Add(c.fresh)
		c.log.Info("cluster: the database is reachable again", "after", time.Since(c.unreachableSince).Round(time.Millisecond))
	case err != nil && c.reachable && !errors.Is(err, context.Canceled):
		c.reachable, c.unreachableSince = false, time.Now()
		c.log.Warn("cluster: the database is unreachable; keeping the last known Edges and Nodes, buffering usage", "err", err)
	}
}

// poke sends on a wake-up channel without blocking: one pending wake-up is
// enough.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
