package registrar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/iop-dev/iop/internal/edge/clusterdb"
)

// PGStore keeps the enrollment in the cluster's PostgreSQL, shared by every
// Edge of the cluster (issue 22): a join token redeemed on one Edge is
// refused on all the others, a removal made on one is refused by all, and
// told to all within about a second (NOTIFY, pgwatch.go).
//
// Every operation that reads and then writes is one transaction that first
// takes the Node's advisory lock (lockNode), then the rows: two Edges acting
// on one Node at the same instant (two redeems of one token, a renewal
// racing a removal) run one after the other, and the second sees what the
// first did. Locks are always taken in that order (Node, then rows), so they
// cannot deadlock.
//
// When the database does not answer, PGStore fails static: Standing answers
// from what it last read (its cache, pgwatch.go), and every write is refused
// with ErrDatabaseUnreachable. Every call has a deadline (opTimeout).
type PGStore struct {
	pool   *pgxpool.Pool
	edgeID string
	log    *slog.Logger

	cache standings
	// probe is when Standing asks the database again after it failed to
	// answer (zero: it answers); see pgwatch.go.
	probe probeGate

	mu        sync.Mutex
	onRemoved func(nodeID string) // Service.removedElsewhere

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Component is the enrollment's name in clusterdb's iop_schema.
const Component = "enrollment"

// opTimeout bounds one operation on the database: a join's whole exchange
// has wireenroll.JoinTimeout (15 s), and an unreachable database must be
// told as such, not waited for.
const opTimeout = 10 * time.Second

// schema is the enrollment's tables, one step per release (clusterdb.Migrate).
// Times are NULL where the records' are zero.
var schema = []string{`
CREATE TABLE iop_enroll_tokens (
	id            text PRIMARY KEY,
	node_id       text NOT NULL,
	secret_sha256 bytea NOT NULL,
	created       timestamptz NOT NULL,
	expires       timestamptz NOT NULL,
	used          timestamptz
);
CREATE INDEX iop_enroll_tokens_node ON iop_enroll_tokens (node_id);
CREATE TABLE iop_enroll_certs (
	serial     text PRIMARY KEY,
	node_id    text NOT NULL,
	not_before timestamptz NOT NULL,
	not_after  timestamptz NOT NULL,
	via        text NOT NULL,
	issued     timestamptz,
	revoked    timestamptz
);
CREATE INDEX iop_enroll_certs_node ON iop_enroll_certs (node_id);
CREATE TABLE iop_enroll_nodes (
	id               text PRIMARY KEY,
	removed          timestamptz,
	revoked_before   timestamptz,
	restored         timestamptz,
	issued           timestamptz,
	last_seen        timestamptz,
	last_seen_serial text NOT NULL DEFAULT ''
);
CREATE TABLE iop_audit (
	id      bigserial PRIMARY KEY,
	at      timestamptz NOT NULL,
	edge_id text NOT NULL,
	actor   text NOT NULL,
	action  text NOT NULL,
	subject text NOT NULL,
	detail  jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX iop_audit_subject ON iop_audit (subject, id);
`}

// PGOptions configure a PGStore.
type PGOptions struct {
	// EdgeID is this Edge's, written in the audit log.
	EdgeID string
	Logger *slog.Logger
}

// OpenPG makes or updates the enrollment's tables in pool's database, reads
// every Node's standing, and starts following the other Edges' changes
// (LISTEN). It fails when the database cannot be reached: an Edge that has
// never read the revocations has nothing to fail static on. Close stops it.
func OpenPG(ctx context.Context, pool *pgxpool.Pool, opts PGOptions) (*PGStore, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := clusterdb.Migrate(ctx, pool, Component, schema); err != nil {
		return nil, fmt.Errorf("enrollment store: %w", err)
	}
	p := &PGStore{pool: pool, edgeID: opts.EdgeID, log: log}
	// LISTEN before the first read, so that no change is missed between
	// them.
	conn, err := p.connectListener(ctx)
	if err != nil {
		return nil, fmt.Errorf("enrollment store: %w", err)
	}
	if _, err := p.reload(ctx); err != nil {
		closeConn(conn)
		return nil, fmt.Errorf("enrollment store: %w", err)
	}
	run, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.wg.Go(func() { p.listen(run, conn) })
	return p, nil
}

// Close stops following the other Edges. The pool is the caller's.
func (p *PGStore) Close() error {
	p.cancel()
	p.wg.Wait()
	return nil
}

// watch sets what a removal made by any Edge calls (Service.New).
func (p *PGStore) watch(onRemoved func(string)) {
	p.mu.Lock()
	p.onRemoved = onRemoved
	p.mu.Unlock()
}

// tx runs f in one transaction with a deadline, and names the failure of
// an unreachable database (ErrDatabaseUnreachable).
// f's own verdicts (a refusal, a removed Node, a signing failure) are
// returned through own, and as they are.
func (p *PGStore) tx(ctx context.Context, f func(context.Context, pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error { return f(ctx, tx) })
	var o *ownErr
	if errors.As(err, &o) {
		return o.err
	}
	if clusterdb.Unreachable(err) {
		p.probe.fail()
		return unreachable(err)
	}
	return err
}

// ownErr is an error of the enrollment's, not the database's: tx returns
// it unchanged.
type ownErr struct{ err error }

func (e *ownErr) Error() string { return e.err.Error() }
func (e *ownErr) Unwrap() error { return e.err }

// own marks err (nil stays nil) as the enrollment's own verdict.
func own(err error) error {
	if err == nil {
		return nil
	}
	return &ownErr{err}
}

var errTokenExists = errors.New("enrollment store: the token exists")

// lockNode serializes, across the cluster, the transactions that act on
// nodeID; released at the transaction's end.
func lockNode(ctx context.Context, tx pgx.Tx, nodeID string) error {
	_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('iop_enroll_node:' || $1))", nodeID)
	return err
}

// audit writes e in tx, as this Edge, with the actor of ctx.
func (p *PGStore) audit(ctx context.Context, tx pgx.Tx, action, subject string, at time.Time, detail map[string]any) error {
	raw, err := json.Marshal(detail)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, "INSERT INTO iop_audit (at, edge_id, actor, action, subject, detail) VALUES ($1, $2, $3, $4, $5, $6)",
		at, p.edgeID, actorOf(ctx), action, subject, string(raw))
	return err
}

// notify tells every Edge (this one too) that nodeID changed, at the
// transaction's commit.
func notify(ctx context.Context, tx pgx.Tx, op, nodeID string) error {
	b, _ := json.Marshal(change{Op: op, Node: nodeID})
	_, err := tx.Exec(ctx, "SELECT pg_notify($1, $2)", notifyChannel, string(b))
	return err
}

// ts is t for a timestamptz column: NULL when zero.
func ts(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// tv is a nullable timestamptz read back: zero when NULL.
func tv(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

const nodeColumns = "id, removed, revoked_before, restored, issued, last_seen, last_seen_serial"

func scanNode(row pgx.Row) (NodeRecord, error) {
	var n NodeRecord
	var removed, revokedBefore, restored, issued, lastSeen *time.Time
	err := row.Scan(&n.ID, &removed, &revokedBefore, &restored, &issued, &lastSeen, &n.LastSeenSerial)
	n.Removed, n.RevokedBefore, n.Restored, n.Issued, n.LastSeen = tv(removed), tv(revokedBefore), tv(restored), tv(issued), tv(lastSeen)
	return n, err
}

// getNode reads nodeID's record; a Node without one is the zero record.
func getNode(ctx context.Context, tx pgx.Tx, nodeID string) (NodeRecord, bool, error) {
	n, err := scanNode(tx.QueryRow(ctx, "SELECT "+nodeColumns+" FROM iop_enroll_nodes WHERE id = $1", nodeID))
	if errors.Is(err, pgx.ErrNoRows) {
		return NodeRecord{}, false, nil
	}
	return n, err == nil, err
}

func putNode(ctx context.Context, tx pgx.Tx, n NodeRecord) error {
	_, err := tx.Exec(ctx, `INSERT INTO iop_enroll_nodes (`+nodeColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (id) DO UPDATE SET removed = excluded.removed, revoked_before = excluded.revoked_before,
			restored = excluded.restored, issued = excluded.issued, last_seen = excluded.last_seen,
			last_seen_serial = excluded.last_seen_serial`,
		n.ID, ts(n.Removed), ts(n.RevokedBefore), ts(n.Restored), ts(n.Issued), ts(n.LastSeen), n.LastSeenSerial)
	return err
}

const certColumns = "serial, node_id, not_before, not_after, via, issued, revoked"

func scanCert(row pgx.Row) (CertRecord, error) {
	var c CertRecord
	var issued, revoked *time.Time
	err := row.Scan(&c.Serial, &c.NodeID, &c.NotBefore, &c.NotAfter, &c.Via, &issued, &revoked)
	c.Issued, c.Revoked = tv(issued), tv(revoked)
	return c, err
}

func putCert(ctx context.Context, tx pgx.Tx, c CertRecord) error {
	_, err := tx.Exec(ctx, `INSERT INTO iop_enroll_certs (`+certColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (serial) DO UPDATE SET node_id = excluded.node_id, not_before = excluded.not_before,
			not_after = excluded.not_after, via = excluded.via, issued = excluded.issued, revoked = excluded.revoked`,
		c.Serial, c.NodeID, c.NotBefore, c.NotAfter, c.Via, ts(c.Issued), ts(c.Revoked))
	return err
}

const tokenColumns = "id, node_id, secret_sha256, created, expires, used"

func scanToken(row pgx.Row) (TokenRecord, error) {
	var t TokenRecord
	var used *time.Time
	err := row.Scan(&t.ID, &t.NodeID, &t.SecretHash, &t.Created, &t.Expires, &used)
	t.Used = tv(used)
	return t, err
}

func putToken(ctx context.Context, tx pgx.Tx, t TokenRecord) error {
	_, err := tx.Exec(ctx, `INSERT INTO iop_enroll_tokens (`+tokenColumns+`) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (id) DO UPDATE SET node_id = excluded.node_id, secret_sha256 = excluded.secret_sha256,
			created = excluded.created, expires = excluded.expires, used = excluded.used`,
		t.ID, t.NodeID, t.SecretHash, t.Created, t.Expires, ts(t.Used))
	return err
}

// AddToken records a new pending token, unless its Node is removed
// (ErrNodeRemoved); under the Node's lock, so a token racing a removal is
// either deleted by it or refused.
func (p *PGStore) AddToken(ctx context.Context, t TokenRecord) error {
	return p.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if err := lockNode(ctx, tx, t.NodeID); err != nil {
			return err
		}
		n, _, err := getNode(ctx, tx, t.NodeID)
		if err != nil {
			return err
		}
		if !n.Removed.IsZero() {
			return own(&removedErr{t.NodeID, n.Removed, fmt.Sprintf("lift the removal with `edged node restore %s` first, then make its token", t.NodeID)})
		}
		tag, err := tx.Exec(ctx, `INSERT INTO iop_enroll_tokens (`+tokenColumns+`) VALUES ($1, $2, $3, $4, $5, NULL)
			ON CONFLICT (id) DO NOTHING`, t.ID, t.NodeID, t.SecretHash, t.Created, t.Expires)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return own(fmt.Errorf("%w: %s", errTokenExists, t.ID))
		}
		return p.audit(ctx, tx, ActionTokenIssued, t.NodeID, t.Created, map[string]any{"token": t.ID, "expires": t.Expires.UTC()})
	})
}

// Redeem is Store.Redeem across the cluster: the token's row is locked
// (FOR UPDATE, under its Node's lock) from its check to its use, so of two
// Edges redeeming it at the same instant one joins and the other finds it
// used.
func (p *PGStore) Redeem(ctx context.Context, id string, check func(TokenRecord, bool) error, issue func(nodeID string) (CertRecord, error), now time.Time) (CertRecord, error) {
	var issued CertRecord
	err := p.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		// The token's Node first (a token's Node never changes), to take
		// the locks in the one order: Node, then rows.
		var nodeID string
		err := tx.QueryRow(ctx, "SELECT node_id FROM iop_enroll_tokens WHERE id = $1", id).Scan(&nodeID)
		if errors.Is(err, pgx.ErrNoRows) {
			return own(check(TokenRecord{}, false))
		}
		if err != nil {
			return err
		}
		if err := lockNode(ctx, tx, nodeID); err != nil {
			return err
		}
		t, err := scanToken(tx.QueryRow(ctx, "SELECT "+tokenColumns+" FROM iop_enroll_tokens WHERE id = $1 FOR UPDATE", id))
		ok := err == nil
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if err := check(t, ok); err != nil {
			return own(err)
		}
		n, _, err := getNode(ctx, tx, t.NodeID)
		if err != nil {
			return err
		}
		if !n.Removed.IsZero() {
			return own(removedError(t.NodeID, n.Removed))
		}
		if issued, err = issue(t.NodeID); err != nil {
			return own(err)
		}
		t.Used = now
		if err := putToken(ctx, tx, t); err != nil {
			return err
		}
		if err := putCert(ctx, tx, issued); err != nil {
			return err
		}
		n.ID, n.Issued = t.NodeID, now
		if err := putNode(ctx, tx, n); err != nil {
			return err
		}
		if err := notify(ctx, tx, opIssued, t.NodeID); err != nil {
			return err
		}
		return p.audit(ctx, tx, ActionNodeJoined, t.NodeID, now, map[string]any{"token": t.ID, "serial": issued.Serial, "not_after": issued.NotAfter.UTC()})
	})
	if err != nil {
		return CertRecord{}, err
	}
	p.cache.issued(issued)
	return issued, nil
}

// Renew is Store.Renew under the Node's lock: a renewal racing a removal
// on another Edge either commits first (and the removal revokes what it
// issued) or sees the removal.
func (p *PGStore) Renew(ctx context.Context, nodeID string, check func(NodeRecord) error, issue func() (CertRecord, error), now time.Time) (CertRecord, error) {
	var issued CertRecord
	err := p.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if err := lockNode(ctx, tx, nodeID); err != nil {
			return err
		}
		n, _, err := getNode(ctx, tx, nodeID)
		if err != nil {
			return err
		}
		if err := check(n); err != nil {
			return own(err)
		}
		if issued, err = issue(); err != nil {
			return own(err)
		}
		if err := putCert(ctx, tx, issued); err != nil {
			return err
		}
		n.ID, n.Issued = nodeID, now
		if err := putNode(ctx, tx, n); err != nil {
			return err
		}
		if err := notify(ctx, tx, opIssued, nodeID); err != nil {
			return err
		}
		return p.audit(ctx, tx, ActionNodeRenewed, nodeID, now, map[string]any{"serial": issued.Serial, "not_after": issued.NotAfter.UTC()})
	})
	if err != nil {
		return CertRecord{}, err
	}
	p.cache.issued(issued)
	return issued, nil
}

// Seen records an admitted connection. While the database does not
// answer it records nothing: a sighting is worth no wait.
func (p *PGStore) Seen(ctx context.Context, nodeID, serial string, now time.Time) error {
	if !p.probe.open() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	_, err := p.pool.Exec(ctx, `INSERT INTO iop_enroll_nodes (id, last_seen, last_seen_serial) VALUES ($1, $2, $3)
		ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen, last_seen_serial = excluded.last_seen_serial`,
		nodeID, now, serial)
	if clusterdb.Unreachable(err) {
		p.probe.fail()
		return unreachable(err)
	}
	return err
}

// Remove is Store.Remove under the Node's lock, told to every Edge.
func (p *PGStore) Remove(ctx context.Context, nodeID string, now time.Time, mark bool) (known bool, revoked []string, err error) {
	var removedAt time.Time
	err = p.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		known, revoked = false, nil
		if err := lockNode(ctx, tx, nodeID); err != nil {
			return err
		}
		n, ok, err := getNode(ctx, tx, nodeID)
		if err != nil {
			return err
		}
		known = ok
		rows, err := tx.Query(ctx, "UPDATE iop_enroll_certs SET revoked = $2 WHERE node_id = $1 AND revoked IS NULL RETURNING serial", nodeID, now)
		if err != nil {
			return err
		}
		if revoked, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return err
		}
		var certs, tokens int
		if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM iop_enroll_certs WHERE node_id = $1),
			(SELECT count(*) FROM iop_enroll_tokens WHERE node_id = $1)`, nodeID).Scan(&certs, &tokens); err != nil {
			return err
		}
		known = known || certs > 0 || tokens > 0
		if _, err := tx.Exec(ctx, "DELETE FROM iop_enroll_tokens WHERE node_id = $1 AND used IS NULL", nodeID); err != nil {
			return err
		}
		if !known && !mark {
			return nil
		}
		n.ID = nodeID
		if n.Removed.IsZero() {
			n.Removed = now
		}
		removedAt = n.Removed
		if err := putNode(ctx, tx, n); err != nil {
			return err
		}
		if err := notify(ctx, tx, opRemoved, nodeID); err != nil {
			return err
		}
		return p.audit(ctx, tx, ActionNodeRemoved, nodeID, now, map[string]any{"revoked_serials": revoked})
	})
	if err != nil {
		return false, nil, err
	}
	if !removedAt.IsZero() {
		p.cache.removed(nodeID, removedAt, revoked)
	}
	return known, revoked, nil
}

// Restore is Store.Restore under the Node's lock, told to every Edge.
func (p *PGStore) Restore(ctx context.Context, nodeID string, now time.Time) (removedAt time.Time, err error) {
	var n NodeRecord
	err = p.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if err := lockNode(ctx, tx, nodeID); err != nil {
			return err
		}
		var ok bool
		n, ok, err = getNode(ctx, tx, nodeID)
		switch {
		case err != nil:
			return err
		case !ok:
			return own(fmt.Errorf("%w: %s", ErrUnknownNode, nodeID))
		case n.Removed.IsZero():
			return own(fmt.Errorf("%w: node %s", ErrNotRemoved, nodeID))
		}
		removedAt = n.Removed
		if n.Removed.After(n.RevokedBefore) {
			n.RevokedBefore = n.Removed
		}
		n.Removed, n.Restored = time.Time{}, now
		if err := putNode(ctx, tx, n); err != nil {
			return err
		}
		if err := notify(ctx, tx, opRestored, nodeID); err != nil {
			return err
		}
		return p.audit(ctx, tx, ActionNodeRestored, nodeID, now, map[string]any{"removed": removedAt.UTC()})
	})
	if err != nil {
		return time.Time{}, err
	}
	p.cache.node(n)
	return removedAt, nil
}

// Contents reads everything in one snapshot.
func (p *PGStore) Contents(ctx context.Context) (Contents, error) {
	var c Contents
	err := p.readOnly(ctx, func(ctx context.Context, tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, "SELECT "+nodeColumns+" FROM iop_enroll_nodes ORDER BY id")
		var err error
		if c.Nodes, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (NodeRecord, error) { return scanNode(r) }); err != nil {
			return err
		}
		rows, _ = tx.Query(ctx, "SELECT "+certColumns+" FROM iop_enroll_certs ORDER BY serial")
		if c.Certs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (CertRecord, error) { return scanCert(r) }); err != nil {
			return err
		}
		rows, _ = tx.Query(ctx, "SELECT "+tokenColumns+" FROM iop_enroll_tokens ORDER BY id")
		c.Tokens, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (TokenRecord, error) { return scanToken(r) })
		return err
	})
	return c, err
}

// readOnly runs f in a read-only snapshot (REPEATABLE READ) with a deadline.
func (p *PGStore) readOnly(ctx context.Context, f func(context.Context, pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	err := pgx.BeginTxFunc(ctx, p.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error { return f(ctx, tx) })
	if clusterdb.Unreachable(err) {
		p.probe.fail()
		return unreachable(err)
	}
	return err
}

// Prune deletes what ended as of now, by the rules of prune.go. Edges
// pruning at once delete the same rows: harmless.
func (p *PGStore) Prune(ctx context.Context, now time.Time) (int, error) {
	var n int64
	err := p.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		cutoff := now.Add(-keepAfterExpiry)
		tag, err := tx.Exec(ctx, "DELETE FROM iop_enroll_tokens WHERE expires < $1", cutoff)
		if err != nil {
			return err
		}
		n = tag.RowsAffected()
		tag, err = tx.Exec(ctx, `DELETE FROM iop_enroll_certs c WHERE c.not_after < $1
			OR (c.not_after <= $2 AND coalesce(c.issued, c.not_before) <
				(SELECT max(coalesce(d.issued, d.not_before)) FROM iop_enroll_certs d WHERE d.node_id = c.node_id))`, cutoff, now)
		n += tag.RowsAffected()
		return err
	})
	return int(n), err
}

// Audit records e (Service.Audit) in a transaction of its own.
func (p *PGStore) Audit(ctx context.Context, e AuditEntry) error {
	detail := e.Detail
	if len(detail) == 0 {
		detail = json.RawMessage("{}")
	}
	return p.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO iop_audit (at, edge_id, actor, action, subject, detail) VALUES ($1, $2, $3, $4, $5, $6)",
			e.At, cmpOr(e.EdgeID, p.edgeID), e.Actor, e.Action, e.Subject, string(detail))
		return err
	})
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// AuditLog reads a page of the audit log, newest first.
func (p *PGStore) AuditLog(ctx context.Context, before int64, limit int) ([]AuditEntry, error) {
	var out []AuditEntry
	err := p.readOnly(ctx, func(ctx context.Context, tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, `SELECT id, at, edge_id, actor, action, subject, detail::text FROM iop_audit
			WHERE $1 = 0 OR id < $1 ORDER BY id DESC LIMIT $2`, before, limit)
		var err error
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
			var e AuditEntry
			var detail string
			err := r.Scan(&e.ID, &e.At, &e.EdgeID, &e.Actor, &e.Action, &e.Subject, &detail)
			e.Detail = json.RawMessage(detail)
			return e, err
		})
		return err
	})
	return out, err
}
