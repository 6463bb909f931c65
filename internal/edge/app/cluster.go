package app

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/fx"

	"github.com/iop-dev/iop/internal/edge/cluster"
	"github.com/iop-dev/iop/internal/edge/clusterdb"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/registrar"
)

// Several Edges (issue 22): with a cluster section the Edge opens the
// cluster's PostgreSQL, publishes itself among the cluster's Edges
// (internal/edge/cluster), keeps its enrollment there (registrar.PGStore),
// and tells its Nodes the cluster's Edge list; alone, it keeps all of that
// in memory and in data_dir, as before.

// connectWait bounds the first connection to the cluster's database: an
// Edge that cannot reach it at start has nothing to fail static on, and
// says so rather than start without its revocations.
const connectWait = 15 * time.Second

// clusterDB is the cluster's database; pool is nil for an Edge alone.
type clusterDB struct{ pool *pgxpool.Pool }

func newClusterDB(lc fx.Lifecycle, cfg *edgeconfig.Config, log *slog.Logger) (*clusterDB, error) {
	if !cfg.Cluster.Enabled() {
		return &clusterDB{}, nil
	}
	dsn, err := cfg.Cluster.DSN()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectWait)
	defer cancel()
	pool, err := clusterdb.Open(ctx, dsn, cfg.EdgeID, log)
	if err != nil {
		return nil, fmt.Errorf("cluster.database_url: %w", err)
	}
	// Appended before everything that uses the pool, so closed after it.
	lc.Append(fx.StopHook(pool.Close))
	log.Info("cluster database connected", "edge_id", cfg.EdgeID, "advertise_quic", cfg.Advertised())
	return &clusterDB{pool: pool}, nil
}

// edgeVersion is edged's version as the build says.
func edgeVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "dev"
}

// newMembership is this Edge's place in its cluster: a *cluster.Cluster
// over the database, or a *cluster.Single for an Edge alone. It is built
// before the listeners (the in-flight tracker records usage into it), so
// its stop hook runs after theirs: the last requests' usage is in its
// final ledger write.
func newMembership(lc fx.Lifecycle, cfg *edgeconfig.Config, reg *fleet.Registry, db *clusterDB, log *slog.Logger) (cluster.Membership, error) {
	self := cluster.Self{ID: cfg.EdgeID, QUICAddr: cfg.Advertised(), HTTPAddr: cfg.AdvertisedHTTP(),
		Version: edgeVersion(), ConfigHash: cluster.ConfigHash(cfg)}
	if db.pool == nil {
		return cluster.NewSingle(self, reg, cluster.LedgerOptions{}), nil
	}
	c, err := cluster.New(db.pool, cluster.Options{Self: self, Fleet: reg, Logger: log})
	if err != nil {
		return nil, err
	}
	lc.Append(fx.Hook{OnStart: c.Start, OnStop: c.Stop})
	return c, nil
}

// edgeDirectory is the cluster's Edge list as the node server tells it to
// Nodes.
type edgeDirectory struct{ c *cluster.Cluster }

func (d edgeDirectory) Edges() []nodeserver.Edge {
	members := d.c.Members()
	out := make([]nodeserver.Edge, 0, len(members))
	for _, m := range members { // alive ones only (Cluster.Members)
		if m.QUICAddr != "" {
			out = append(out, nodeserver.Edge{ID: m.ID, QUICAddr: m.QUICAddr, Stopping: m.Stopping})
		}
	}
	return out
}

func (d edgeDirectory) Changed() <-chan struct{} { return d.c.Changed() }

// directory is the Edge list Nodes are told: nil for an Edge alone (its
// Nodes keep their configured address).
func directory(m cluster.Membership) nodeserver.EdgeDirectory {
	if c, ok := m.(*cluster.Cluster); ok {
		return edgeDirectory{c}
	}
	return nil
}

// publishing applies a reloaded configuration to the dispatcher, then
// publishes the hash of its shared sections to the cluster, whose view
// shows an Edge whose configuration differs from the others', and records
// the reload in the audit log (kept in a cluster's database).
type publishing struct {
	*dispatch.Dispatcher
	c     cluster.Membership
	audit *registrar.Service // nil: no enrollment, no audit log
	log   *slog.Logger
}

func (p publishing) SetConfig(cfg *edgeconfig.Config) {
	p.Dispatcher.SetConfig(cfg)
	p.c.PublishConfig(cfg)
	if p.audit == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.audit.Audit(ctx, "edged", "config.reload", cfg.EdgeID, map[string]string{"config_hash": cluster.ConfigHash(cfg)}); err != nil {
		p.log.Warn("the reload is not in the audit log", "err", err)
	}
}
