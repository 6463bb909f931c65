package registrar

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/iop-dev/iop/internal/edge/clusterdb"
)

// ActionStoreImported is the audit log's entry of an Import.
const ActionStoreImported = "store.imported"

// ImportCounts counts records by kind.
type ImportCounts struct {
	Nodes  int `json:"nodes"`
	Certs  int `json:"certificates"`
	Tokens int `json:"tokens"`
}

// ImportResult is what Import did: the records it copied, and the ones the
// database had already (a second run copies nothing).
type ImportResult struct {
	Copied  ImportCounts `json:"copied"`
	Present ImportCounts `json:"already_present"`
}

// importTimeout bounds an Import: a store holds thousands of records, not
// millions.
const importTimeout = 5 * time.Minute

// Import copies the contents of a single Edge's store (Store.Contents)
// into the cluster's database at pool, making its tables if needed, in one
// transaction: all of it or nothing. A record the database has already
// (same token id, serial or node id) is left as the database has it: once
// a cluster runs, its database is the newer truth, and a second Import of
// the same store changes nothing. Removals copied are told to the running
// Edges (NOTIFY), which fence those Nodes. The audit log records the
// import, by actor, on edgeID.
func Import(ctx context.Context, pool *pgxpool.Pool, c Contents, edgeID, actor string) (ImportResult, error) {
	ctx, cancel := context.WithTimeout(ctx, importTimeout)
	defer cancel()
	if err := clusterdb.Migrate(ctx, pool, Component, schema); err != nil {
		return ImportResult{}, fmt.Errorf("enrollment store: %w", err)
	}
	var res ImportResult
	p := &PGStore{pool: pool, edgeID: edgeID}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res = ImportResult{}
		count := func(tag int64, copied, present *int) {
			if tag == 1 {
				*copied++
			} else {
				*present++
			}
		}
		for _, n := range c.Nodes {
			tag, err := tx.Exec(ctx, `INSERT INTO iop_enroll_nodes (`+nodeColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7)
				ON CONFLICT (id) DO NOTHING`,
				n.ID, ts(n.Removed), ts(n.RevokedBefore), ts(n.Restored), ts(n.Issued), ts(n.LastSeen), n.LastSeenSerial)
			if err != nil {
				return fmt.Errorf("node %s: %w", n.ID, err)
			}
			count(tag.RowsAffected(), &res.Copied.Nodes, &res.Present.Nodes)
			if tag.RowsAffected() == 1 && !n.Removed.IsZero() {
				if err := notify(ctx, tx, opRemoved, n.ID); err != nil {
					return err
				}
			}
		}
		for _, cr := range c.Certs {
			tag, err := tx.Exec(ctx, `INSERT INTO iop_enroll_certs (`+certColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7)
				ON CONFLICT (serial) DO NOTHING`,
				cr.Serial, cr.NodeID, cr.NotBefore, cr.NotAfter, cr.Via, ts(cr.Issued), ts(cr.Revoked))
			if err != nil {
				return fmt.Errorf("certificate %s: %w", cr.Serial, err)
			}
			count(tag.RowsAffected(), &res.Copied.Certs, &res.Present.Certs)
		}
		for _, t := range c.Tokens {
			tag, err := tx.Exec(ctx, `INSERT INTO iop_enroll_tokens (`+tokenColumns+`) VALUES ($1, $2, $3, $4, $5, $6)
				ON CONFLICT (id) DO NOTHING`,
				t.ID, t.NodeID, t.SecretHash, t.Created, t.Expires, ts(t.Used))
			if err != nil {
				return fmt.Errorf("token %s: %w", t.ID, err)
			}
			count(tag.RowsAffected(), &res.Copied.Tokens, &res.Present.Tokens)
		}
		if res.Copied == (ImportCounts{}) {
			return nil
		}
		return p.audit(withActor(ctx, actor), tx, ActionStoreImported, edgeID, time.Now(), map[string]any{"copied": res.Copied, "already_present": res.Present})
	})
	if err != nil {
		return ImportResult{}, fmt.Errorf("enrollment store: import: %w", err)
	}
	return res, nil
}
