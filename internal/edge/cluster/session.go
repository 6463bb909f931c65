package cluster

import (
	"context"
	"errors"
	"hash/fnv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// notifyChannel is the NOTIFY channel of membership changes. A payload is
// "join:ID", "state:ID" (stopping, configuration) or "leave:ID"; every
// Edge reads the table again on any of them, so the payload is for
// people watching with psql.
const notifyChannel = "iop_edges"

// errIDHeld is a session refused its lock: another live process is this
// Edge (the same edge_id twice in the cluster), or the previous process's
// connection has not been closed yet.
var errIDHeld = errors.New("another process holds this Edge's id in the cluster")

// lockKey is the advisory lock of an Edge id: FNV-1a 64 of the id. Other
// Edges find it in pg_locks by the lock_key of the Edge's row.
func lockKey(edgeID string) int64 {
	h := fnv.New64a()
	h.Write([]byte("iop-edge-lock:" + edgeID))
	return int64(h.Sum64())
}

// session is the Edge's own connection: it holds the Edge's advisory lock
// for as long as it is open and listens for membership changes. It is a
// connection of its own, not one of the pool's, so that nothing but this
// process's end (or the network's) closes it.
type session struct {
	conn atomic.Pointer[pgx.Conn]
}

// runSession keeps the session up until ctx is done: connect, take the
// lock, listen, join; then wait for notifications, and start over after a
// second when anything fails.
func (c *Cluster) runSession(ctx context.Context) {
	warnedHeld := false
	for {
		began := time.Now()
		err := c.session(ctx)
		c.setHeld(false)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errIDHeld) {
			if !warnedHeld {
				c.log.Error("cluster: this Edge's id is held by another live process: two Edges with the same edge_id, "+
					"or the previous process's connection not closed yet; retrying every second", "edge", c.self.ID)
				warnedHeld = true
			}
		} else {
			c.setReachable(err)
		}
		// A session that lived a while is tried again at once (a
		// restarted database), a failing one every heartbeat.
		wait := c.heartbeat
		if time.Since(began) > c.fresh {
			wait = c.heartbeat / 10
		}
		if !sleep(ctx, wait) {
			return
		}
	}
}

// session runs one session connection until it fails or ctx is done.
func (c *Cluster) session(ctx context.Context) error {
	// The pool's settings (clusterdb.Config): application_name
	// iop-edge:<id>, keep-alives, timeouts.
	cfg := c.pool.Config().ConnConfig.Copy()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	c.sess.conn.Store(conn)
	defer func() {
		c.sess.conn.Store(nil)
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn.Close(closeCtx)
	}()
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, lockKey(c.self.ID)).Scan(&locked); err != nil {
		return err
	}
	if !locked {
		return errIDHeld
	}
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return err
	}
	if err := c.upsertSelf(ctx, conn, "join:"); err != nil {
		return err
	}
	c.setReachable(nil)
	c.setHeld(true)
	// Another Edge may have removed this one's Nodes while it was away.
	poke(c.resyncNodes)
	poke(c.wake)
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		poke(c.wake)
	}
}

func (c *Cluster) setHeld(held bool) {
	c.mu.Lock()
	c.held = held
	c.mu.Unlock()
}

// sleep waits d or until ctx is done; false when ctx is.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
