package registrar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/iop-dev/iop/internal/edge/clusterdb"
	"github.com/iop-dev/iop/quicwire"
)

// How a cluster Edge follows the others and fails static.
//
// Every change to a Node's standing (a removal, a restore, a certificate
// issued) is NOTIFY'd on notifyChannel in its own transaction, so it is
// delivered at commit to every Edge that LISTENs, this one too. Each Edge
// LISTENs on a connection of its own (listen), reconnecting with backoff;
// after each (re)connection it reads every standing again (reload), since
// it may have missed notifications while away. A removal fences the Node's
// connection on every Edge (Service.removedElsewhere) within about a
// second.
//
// The standings read last are kept (standings): when the database does not
// answer, Standing answers from them: an Edge keeps admitting the Nodes it
// knew and refusing the ones it knew removed. Writes are refused with
// ErrDatabaseUnreachable; they cannot be decided without the other Edges.

// notifyChannel is the channel of the enrollment's changes.
const notifyChannel = "iop_enroll"

// Operations a change names.
const (
	opRemoved  = "removed"
	opRestored = "restored"
	opIssued   = "issued"
)

// change is a notification's payload.
type change struct {
	Op   string `json:"op"`
	Node string `json:"node"`
}

// maxChangePayload bounds a notification's payload: an op and a Node id.
const maxChangePayload = 1024

// parseChange reads a notification's payload. Whoever can NOTIFY on the
// database can send one, and a removal fences a Node: the op must be one
// of ours and the Node id valid, or nothing is done.
func parseChange(payload string) (change, error) {
	if len(payload) > maxChangePayload {
		return change{}, fmt.Errorf("%d bytes, more than %d", len(payload), maxChangePayload)
	}
	var c change
	if err := json.Unmarshal([]byte(payload), &c); err != nil {
		return change{}, err
	}
	switch c.Op {
	case opRemoved, opRestored, opIssued:
	default:
		return change{}, fmt.Errorf("unknown op %q", c.Op)
	}
	if err := quicwire.ValidateID(c.Node); err != nil {
		return change{}, fmt.Errorf("node id: %w", err)
	}
	return c, nil
}

// Reconnection backoff of the listening connection.
const (
	listenBackoffMin = 100 * time.Millisecond
	listenBackoffMax = 5 * time.Second
)

// standingTimeout bounds Standing's read of the database: a Node's
// connection waits for it, so an unresponsive database is given up on
// quickly and the cache answers.
const standingTimeout = 2 * time.Second

// probeRetry is how long after the database failed to answer Standing and
// Seen use the cache alone before one of them asks the database again.
const probeRetry = 2 * time.Second

// probeGate says whether to ask the database: always while it answers;
// after it failed, once per probeRetry (one caller asks, the others use the
// cache meanwhile).
type probeGate struct {
	until atomic.Int64 // unix nanoseconds; 0: the database answers
}

// open reports whether the caller should ask the database now.
func (g *probeGate) open() bool {
	until := g.until.Load()
	if until == 0 {
		return true
	}
	now := time.Now().UnixNano()
	if now < until {
		return false
	}
	return g.until.CompareAndSwap(until, now+int64(probeRetry))
}

// fail records that the database did not answer.
func (g *probeGate) fail() { g.until.Store(time.Now().Add(probeRetry).UnixNano()) }

// ok records that it answered.
func (g *probeGate) ok() { g.until.Store(0) }

// standings is what an Edge last read of every Node's standing: enough to
// answer Standing without the database.
type standings struct {
	mu    sync.RWMutex
	nodes map[string]nodeStanding // by node id
	certs map[string]certStanding // by serial
}

type nodeStanding struct{ removed, revokedBefore time.Time }

type certStanding struct {
	nodeID  string
	revoked time.Time
}

// replace sets the whole cache, and returns the Nodes it now holds removed
// that it did not before: removals made while this Edge was not listening.
func (c *standings) replace(nodes map[string]nodeStanding, certs map[string]certStanding) (newlyRemoved []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, n := range nodes {
		if !n.removed.IsZero() && c.nodes[id].removed.IsZero() {
			newlyRemoved = append(newlyRemoved, id)
		}
	}
	c.nodes, c.certs = nodes, certs
	return newlyRemoved
}

// standing answers from the cache.
func (c *standings) standing(nodeID, serial string) Standing {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := c.nodes[nodeID]
	st := Standing{NodeRemoved: n.removed, RevokedBefore: n.revokedBefore}
	if cs, ok := c.certs[serial]; ok && cs.nodeID == nodeID {
		st.CertKnown, st.CertRevoked = true, cs.revoked
	}
	return st
}

// set records a standing read from the database.
func (c *standings) set(nodeID, serial string, st Standing) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.init()
	c.nodes[nodeID] = nodeStanding{st.NodeRemoved, st.RevokedBefore}
	if st.CertKnown {
		c.certs[serial] = certStanding{nodeID, st.CertRevoked}
	}
}

func (c *standings) init() {
	if c.nodes == nil {
		c.nodes, c.certs = map[string]nodeStanding{}, map[string]certStanding{}
	}
}

// issued records a certificate this Edge issued.
func (c *standings) issued(rec CertRecord) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.init()
	c.certs[rec.Serial] = certStanding{rec.NodeID, rec.Revoked}
}

// removed records a removal this Edge made.
func (c *standings) removed(nodeID string, at time.Time, revoked []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.init()
	n := c.nodes[nodeID]
	n.removed = at
	c.nodes[nodeID] = n
	for _, s := range revoked {
		c.certs[s] = certStanding{nodeID, at}
	}
}

// node records a Node's record, its certificates untouched.
func (c *standings) node(n NodeRecord) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.init()
	c.nodes[n.ID] = nodeStanding{n.Removed, n.RevokedBefore}
}

// nodeWithCerts replaces what the cache holds of one Node.
func (c *standings) nodeWithCerts(nodeID string, n nodeStanding, certs map[string]certStanding) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.init()
	c.nodes[nodeID] = n
	for serial, cs := range c.certs {
		if cs.nodeID == nodeID {
			delete(c.certs, serial)
		}
	}
	for serial, cs := range certs {
		c.certs[serial] = cs
	}
}

// Standing reads the standing of nodeID's certificate serial from the
// database, and from the cache when the database does not answer (fail
// static): never an error for an unreachable database.
func (p *PGStore) Standing(ctx context.Context, nodeID, serial string) (Standing, error) {
	if !p.probe.open() {
		return p.cache.standing(nodeID, serial), nil
	}
	ctx, cancel := context.WithTimeout(ctx, standingTimeout)
	defer cancel()
	var st Standing
	var removed, revokedBefore, revoked *time.Time
	var certNode *string
	err := p.pool.QueryRow(ctx, `SELECT n.removed, n.revoked_before, c.node_id, c.revoked
		FROM (SELECT 1) one
		LEFT JOIN iop_enroll_nodes n ON n.id = $1
		LEFT JOIN iop_enroll_certs c ON c.serial = $2`, nodeID, serial).Scan(&removed, &revokedBefore, &certNode, &revoked)
	if err != nil {
		if !clusterdb.Unreachable(err) {
			return Standing{}, err
		}
		p.lost(err)
		return p.cache.standing(nodeID, serial), nil
	}
	p.probe.ok()
	st.NodeRemoved, st.RevokedBefore = tv(removed), tv(revokedBefore)
	if certNode != nil && *certNode == nodeID {
		st.CertKnown, st.CertRevoked = true, tv(revoked)
	}
	p.cache.set(nodeID, serial, st)
	return st, nil
}

// lost records that the database did not answer, logging it once per
// outage.
func (p *PGStore) lost(err error) {
	first := p.probe.until.Load() == 0
	p.probe.fail()
	if first {
		p.log.Warn("cluster database unreachable: Node connections are checked against the revocations last read; joins, renewals and removals are refused until it is back", "err", err)
	}
}

// reload reads every Node's standing into the cache, and returns the Nodes
// found removed that the cache did not hold removed.
func (p *PGStore) reload(ctx context.Context) ([]string, error) {
	nodes := map[string]nodeStanding{}
	certs := map[string]certStanding{}
	err := p.readOnly(ctx, func(ctx context.Context, tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, "SELECT id, removed, revoked_before FROM iop_enroll_nodes")
		var id string
		var removed, revokedBefore *time.Time
		_, err := pgx.ForEachRow(rows, []any{&id, &removed, &revokedBefore}, func() error {
			nodes[id] = nodeStanding{tv(removed), tv(revokedBefore)}
			return nil
		})
		if err != nil {
			return err
		}
		rows, _ = tx.Query(ctx, "SELECT serial, node_id, revoked FROM iop_enroll_certs")
		var serial, nodeID string
		var revoked *time.Time
		_, err = pgx.ForEachRow(rows, []any{&serial, &nodeID, &revoked}, func() error {
			certs[serial] = certStanding{nodeID, tv(revoked)}
			return nil
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	removed := p.cache.replace(nodes, certs)
	p.probe.ok()
	return removed, nil
}

// refresh reads one Node's standing into the cache.
func (p *PGStore) refresh(ctx context.Context, nodeID string) error {
	var n nodeStanding
	certs := map[string]certStanding{}
	err := p.readOnly(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var removed, revokedBefore *time.Time
		err := tx.QueryRow(ctx, "SELECT removed, revoked_before FROM iop_enroll_nodes WHERE id = $1", nodeID).Scan(&removed, &revokedBefore)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		n = nodeStanding{tv(removed), tv(revokedBefore)}
		rows, _ := tx.Query(ctx, "SELECT serial, revoked FROM iop_enroll_certs WHERE node_id = $1", nodeID)
		var serial string
		var revoked *time.Time
		_, err = pgx.ForEachRow(rows, []any{&serial, &revoked}, func() error {
			certs[serial] = certStanding{nodeID, tv(revoked)}
			return nil
		})
		return err
	})
	if err != nil {
		return err
	}
	p.cache.nodeWithCerts(nodeID, n, certs)
	return nil
}

// listen follows the cluster's enrollment changes until ctx ends, on
// conn (LISTENing already; nil: connect first). Each time it connects
// again, the cache is read again whole, and a removal made meanwhile fences
// the Node here.
func (p *PGStore) listen(ctx context.Context, conn *pgx.Conn) {
	backoff := listenBackoffMin
	for ctx.Err() == nil {
		if conn == nil {
			var err error
			if conn, err = p.connectListener(ctx); err == nil {
				var removed []string
				if removed, err = p.reload(ctx); err != nil {
					closeConn(conn)
					conn = nil
				} else {
					backoff = listenBackoffMin
					p.log.Info("cluster database: following the enrollment again")
					for _, nodeID := range removed {
						p.removedElsewhere(nodeID)
					}
				}
			}
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				p.lost(err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, listenBackoffMax)
				continue
			}
		}
		err := p.follow(ctx, conn)
		closeConn(conn)
		conn = nil
		if ctx.Err() != nil {
			return
		}
		p.lost(err)
	}
	if conn != nil {
		closeConn(conn)
	}
}

// connectListener opens the connection that LISTENs.
func (p *PGStore) connectListener(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, p.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// follow handles notifications until the connection fails or ctx ends.
func (p *PGStore) follow(ctx context.Context, conn *pgx.Conn) error {
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		p.handle(ctx, n.Payload)
	}
}

// handle applies one notification: the Node's standing is read again, and
// a removal fences its connection here.
func (p *PGStore) handle(ctx context.Context, payload string) {
	c, err := parseChange(payload)
	if err != nil {
		p.log.Warn("enrollment store: a notification that does not parse", "payload", payload, "err", err)
		return
	}
	if err := p.refresh(ctx, c.Node); err != nil {
		p.log.Warn("enrollment store: could not read a changed Node's standing", "node", c.Node, "err", err)
		if c.Op == opRemoved {
			// Known removed all the same: refuse it from the cache.
			p.cache.removed(c.Node, time.Now(), nil)
		}
	}
	if c.Op == opRemoved {
		p.removedElsewhere(c.Node)
	}
}

// removedElsewhere tells the Service (watch) of a removal.
func (p *PGStore) removedElsewhere(nodeID string) {
	p.mu.Lock()
	onRemoved := p.onRemoved
	p.mu.Unlock()
	if onRemoved != nil {
		onRemoved(nodeID)
	}
}
