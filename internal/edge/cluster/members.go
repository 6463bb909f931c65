package cluster

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
)

// Member is one Edge of the cluster, as its row and lock show it.
type Member struct {
	ID         string `json:"id"`
	QUICAddr   string `json:"quic_address"`
	HTTPAddr   string `json:"http_address"`
	Version    string `json:"version"`
	ConfigHash string `json:"config_hash"`
	// StartedAt is when the Edge's process started; HeartbeatAt its last
	// heartbeat.
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	// HeartbeatAge is how old the heartbeat was when the row was read, by
	// the database's clock (so Edges' clocks need not agree).
	HeartbeatAge time.Duration `json:"-"`
	// Stopping: the Edge drains (a planned stop); it takes no new work.
	Stopping bool `json:"stopping"`
	// Alive: the Edge holds its lock (its session connection is open) and
	// its heartbeat is fresh. An Edge is always alive to itself.
	Alive bool `json:"alive"`
	// Self: this is the Edge that answers.
	Self bool `json:"self,omitempty"`
}

// Members returns the Edges alive now, this one included, sorted by id.
// With the database unreachable it is the list last read (fail static).
func (c *Cluster) Members() []Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Member, 0, len(c.members))
	for _, m := range c.members {
		if m.Alive {
			out = append(out, m)
		}
	}
	return out
}

// Changed returns a channel closed at the next change of the members: an
// Edge joins, leaves, dies, starts stopping, or changes its addresses,
// version or configuration hash.
func (c *Cluster) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// MarkStopping marks this Edge as stopping (draining) in its row: the
// others see it within about a second. It does not wait for the write;
// with the database unreachable the row is written when it is back.
func (c *Cluster) MarkStopping() {
	c.mu.Lock()
	c.stopping = true
	c.dirty = true
	c.setSelfLocked()
	c.mu.Unlock()
	poke(c.wake)
}

// SetConfigHash publishes hash as this Edge's configuration hash
// (ConfigHash), as MarkStopping publishes its state.
func (c *Cluster) SetConfigHash(hash string) {
	c.mu.Lock()
	if c.configHash != hash {
		c.configHash = hash
		c.dirty = true
		c.setSelfLocked()
	}
	c.mu.Unlock()
	poke(c.wake)
}

// PublishConfig publishes the hash of cfg's shared sections (ConfigHash):
// call it at start and after every applied reload.
func (c *Cluster) PublishConfig(cfg *edgeconfig.Config) { c.SetConfigHash(ConfigHash(cfg)) }

// selfMember is this Edge as it knows itself.
func (c *Cluster) selfMember() Member {
	return Member{
		ID: c.self.ID, QUICAddr: c.self.QUICAddr, HTTPAddr: c.self.HTTPAddr, Version: c.self.Version,
		ConfigHash: c.configHash, StartedAt: c.started, HeartbeatAt: c.lastBeat, Stopping: c.stopping,
		Alive: true, Self: true,
	}
}

// setSelfLocked puts this Edge's own state in the member list and tells
// the watchers when that changes it. Callers hold c.mu.
func (c *Cluster) setSelfLocked() {
	next := slices.Clone(c.members)
	self := c.selfMember()
	i, found := slices.BinarySearchFunc(next, self.ID, func(m Member, id string) int { return strings.Compare(m.ID, id) })
	if found {
		self.HeartbeatAge = next[i].HeartbeatAge
		next[i] = self
	} else {
		next = slices.Insert(next, i, self)
	}
	c.setMembersLocked(next)
}

// setMembersLocked replaces the member list, closing Changed when it
// differs in more than heartbeat times. Callers hold c.mu.
func (c *Cluster) setMembersLocked(next []Member) {
	if !slices.EqualFunc(c.members, next, sameMember) {
		close(c.changed)
		c.changed = make(chan struct{})
	}
	c.members = next
}

// sameMember compares what watchers care about: not the heartbeat.
func sameMember(a, b Member) bool {
	a.HeartbeatAt, a.HeartbeatAge, b.HeartbeatAt, b.HeartbeatAge = time.Time{}, 0, time.Time{}, 0
	return a == b
}

// batcher is a pool or a connection.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// upsertSelf writes this Edge's row with a fresh heartbeat, and, when
// notify is not empty, sends notify+id to the other Edges.
func (c *Cluster) upsertSelf(ctx context.Context, db batcher, notify string) error {
	c.mu.Lock()
	self := c.selfMember()
	c.mu.Unlock()
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO iop_edges (edge_id, quic_address, http_address, version, config_hash, lock_key, started_at, heartbeat_at, stopping)
		VALUES ($1, $2, $3, $4, $5, $6, $7, now(), $8)
		ON CONFLICT (edge_id) DO UPDATE SET quic_address = excluded.quic_address, http_address = excluded.http_address,
			version = excluded.version, config_hash = excluded.config_hash, lock_key = excluded.lock_key,
			started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at, stopping = excluded.stopping`,
		self.ID, self.QUICAddr, self.HTTPAddr, self.Version, self.ConfigHash, lockKey(self.ID), self.StartedAt, self.Stopping)
	if notify != "" {
		b.Queue(`SELECT pg_notify($1, $2)`, notifyChannel, notify+self.ID)
	}
	return db.SendBatch(ctx, b).Close()
}

// runMembership heartbeats this Edge's row and reads the others' every
// heartbeat, and at once when woken (a NOTIFY, or this Edge's own change).
func (c *Cluster) runMembership(ctx context.Context) {
	t := time.NewTicker(c.heartbeat)
	defer t.Stop()
	beat := true
	for {
		c.mu.Lock()
		held, dirty := c.held, c.dirty
		c.mu.Unlock()
		if held && (beat || dirty) {
			c.beat(ctx, dirty)
		}
		c.refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			beat = true
		case <-c.wake:
			beat = false
		}
	}
}

// beat writes this Edge's row with a fresh heartbeat; dirty: its state
// changed, and the others are told.
func (c *Cluster) beat(ctx context.Context, dirty bool) {
	notify := ""
	if dirty {
		notify = "state:"
	}
	ctx, cancel := context.WithTimeout(ctx, c.fresh)
	defer cancel()
	err := c.upsertSelf(ctx, c.pool, notify)
	c.setReachable(err)
	if err != nil {
		return
	}
	c.mu.Lock()
	c.lastBeat = time.Now()
	if dirty {
		c.dirty = false
	}
	c.mu.Unlock()
}

// heldLocks are the keys of the advisory locks held now in this database:
// pg_locks shows the two halves of a bigint key as classid and objid, with
// objsubid 1.
const heldLocks = `
	SELECT (classid::int8 << 32) | objid::int8 AS key FROM pg_locks
	WHERE locktype = 'advisory' AND granted AND objsubid = 1
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// membersQuery reads every Edge's row with its heartbeat's age and whether
// its advisory lock is held now.
const membersQuery = `
SELECT e.edge_id, e.quic_address, e.http_address, e.version, e.config_hash, e.started_at, e.heartbeat_at, e.stopping,
	extract(epoch FROM clock_timestamp() - e.heartbeat_at)::float8,
	e.lock_key IN (` + heldLocks + `)
FROM iop_edges e
ORDER BY e.edge_id`

// refresh reads the members. On failure the list stays as it was (fail
// static).
func (c *Cluster) refresh(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, c.fresh)
	defer cancel()
	rows, err := c.pool.Query(ctx, membersQuery)
	var read []Member
	if err == nil {
		read, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Member, error) {
			var m Member
			var age float64
			var locked bool
			err := row.Scan(&m.ID, &m.QUICAddr, &m.HTTPAddr, &m.Version, &m.ConfigHash, &m.StartedAt, &m.HeartbeatAt, &m.Stopping, &age, &locked)
			m.HeartbeatAge = time.Duration(age * float64(time.Second))
			m.Alive = locked && m.HeartbeatAge < c.fresh
			return m, err
		})
	}
	c.setReachable(err)
	if err != nil {
		return
	}
	var dead, forget []string
	c.mu.Lock()
	before := c.members
	settling := time.Now().Before(c.settleUntil)
	wasAlive := make(map[string]bool, len(before))
	for _, m := range before {
		wasAlive[m.ID] = m.Alive
	}
	next := make([]Member, 0, len(read)+1)
	self := c.selfMember()
	for _, m := range read {
		if m.ID == c.self.ID {
			self.HeartbeatAge = m.HeartbeatAge
			continue // this Edge is what it knows of itself
		}
		if !m.Alive && settling && wasAlive[m.ID] {
			m.Alive = true
		}
		next = append(next, m)
		switch {
		case m.Alive:
			delete(c.cleaned, m.ID)
		case m.HeartbeatAge > c.forget:
			forget = append(forget, m.ID)
		case !c.cleaned[m.ID]:
			dead = append(dead, m.ID)
		}
	}
	i, _ := slices.BinarySearchFunc(next, self.ID, func(m Member, id string) int { return strings.Compare(m.ID, id) })
	next = slices.Insert(next, i, self)
	c.setMembersLocked(next)
	c.logChangesLocked(before, next)
	c.mu.Unlock()
	c.removeDead(ctx, dead, forget)
}

// removeDead deletes the Node rows of Edges found dead, and the rows of
// Edges dead for longer than Forget. Every Edge may do it: the statements
// check again that the Edge is not back.
func (c *Cluster) removeDead(ctx context.Context, dead, forget []string) {
	if len(dead) == 0 && len(forget) == 0 {
		return
	}
	b := &pgx.Batch{}
	if len(dead) > 0 {
		// Only while the Edge is still without its lock: one that came
		// back in between rewrites its Nodes anyway, but need not.
		b.Queue(`DELETE FROM iop_edge_nodes n USING iop_edges e WHERE n.edge_id = e.edge_id AND e.edge_id = ANY($1)
			AND e.lock_key NOT IN (`+heldLocks+`)`, dead)
	}
	if len(forget) > 0 {
		b.Queue(`DELETE FROM iop_edge_nodes WHERE edge_id = ANY($1)`, forget)
		b.Queue(`DELETE FROM iop_edges WHERE edge_id = ANY($1) AND heartbeat_at < now() - make_interval(secs => $2)`,
			forget, c.forget.Seconds())
	}
	err := c.pool.SendBatch(ctx, b).Close()
	c.setReachable(err)
	if err != nil {
		return
	}
	c.mu.Lock()
	for _, id := range dead {
		c.cleaned[id] = true
	}
	c.mu.Unlock()
}

// logChangesLocked logs the Edges that joined, died, started stopping or
// left between two member lists.
func (c *Cluster) logChangesLocked(before, after []Member) {
	was := make(map[string]Member, len(before))
	for _, m := range before {
		was[m.ID] = m
	}
	for _, m := range after {
		old, known := was[m.ID]
		delete(was, m.ID)
		switch {
		case m.Self:
		case m.Alive && (!known || !old.Alive):
			c.log.Info("cluster: Edge alive", "peer", m.ID, "quic", m.QUICAddr, "version", m.Version)
		case !m.Alive && known && old.Alive:
			c.log.Warn("cluster: Edge lost", "peer", m.ID, "heartbeat_age", m.HeartbeatAge.Round(time.Millisecond),
				"why", deathCause(m, c.fresh))
		}
		if m.Alive && m.Stopping && known && !old.Stopping {
			c.log.Info("cluster: Edge stopping", "peer", m.ID)
		}
	}
	for id := range was {
		c.log.Info("cluster: Edge left", "peer", id)
	}
}

// deathCause says why a member is not alive.
func deathCause(m Member, fresh time.Duration) string {
	if m.HeartbeatAge >= fresh {
		return "its heartbeat is stale"
	}
	return "its connection to the database closed"
}
