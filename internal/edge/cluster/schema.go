package cluster

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/iop-dev/iop/internal/edge/clusterdb"
)

// component names this package's schema in clusterdb's record of applied
// steps.
const component = "cluster"

// schema is this package's tables, one step per change; a step once
// released is never edited, only followed by another.
//
// iop_edges: one row per Edge, its own to write (membership.go). lock_key
// is the advisory lock the Edge holds while it lives.
//
// iop_edge_nodes: which Nodes each Edge is connected to, written by that
// Edge (nodes.go); rows of a dead Edge are removed by the others.
//
// iop_usage: the usage ledger, by minute, Edge, principal, model and Node
// (ledger.go); each Edge adds to its own rows only, so Edges never contend.
// iop_usage_batches makes a batch's write idempotent: a batch whose outcome
// was lost with its connection is sent again under the same id, and counted
// once.
var schema = []string{
	`CREATE TABLE iop_edges (
		edge_id      text PRIMARY KEY,
		quic_address text NOT NULL,
		http_address text NOT NULL,
		version      text NOT NULL,
		config_hash  text NOT NULL DEFAULT '',
		lock_key     bigint NOT NULL,
		started_at   timestamptz NOT NULL,
		heartbeat_at timestamptz NOT NULL,
		stopping     boolean NOT NULL DEFAULT false
	);
	CREATE TABLE iop_edge_nodes (
		edge_id    text NOT NULL,
		node_id    text NOT NULL,
		generation bigint NOT NULL,
		state      text NOT NULL,
		suspect    boolean NOT NULL DEFAULT false,
		since      timestamptz NOT NULL,
		PRIMARY KEY (edge_id, node_id)
	);
	CREATE TABLE iop_usage (
		minute            timestamptz NOT NULL,
		edge_id           text NOT NULL,
		principal         text NOT NULL,
		model             text NOT NULL,
		node_id           text NOT NULL,
		requests          bigint NOT NULL,
		prompt_tokens     bigint NOT NULL,
		completion_tokens bigint NOT NULL,
		PRIMARY KEY (minute, edge_id, principal, model, node_id)
	);
	CREATE TABLE iop_usage_batches (
		edge_id    text NOT NULL,
		batch_id   bigint NOT NULL,
		written_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (edge_id, batch_id)
	);`,
}

// Migrate creates or updates the cluster's tables in pool's database
// (clusterdb.Migrate: each step once, Edges starting together wait for
// each other).
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return clusterdb.Migrate(ctx, pool, component, schema)
}
