// Package clusterdb opens the cluster's PostgreSQL database (cluster.database_url) and keeps
// its schema: the one place that knows the pool's settings, the Edge's application_name, how
// an unreachable database is told from a refusal, and how the tables of each component
// (enrollment, the cluster's membership and ledger) are created and updated by several Edges
// starting at once (issue 22).
package clusterdb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool settings. The Edge's database work is small and short (enrollment, a batched ledger,
// heartbeats); what matters is noticing a lost database quickly and never queueing behind it.
const (
	// ConnectTimeout bounds one connection attempt (dial, TLS, startup), unless the DSN sets
	// connect_timeout: a database that does not answer is unreachable, not slow.
	ConnectTimeout = 5 * time.Second
	// MaxConns is the pool's size unless the DSN sets pool_max_conns.
	MaxConns = 16
	// keepAliveIdle/Interval/Count make the kernel notice a silent peer (a partitioned
	// database) in about 30 s on a connection that is waiting, rather than the system's
	// default of hours.
	keepAliveIdle     = 15 * time.Second
	keepAliveInterval = 5 * time.Second
	keepAliveCount    = 3
	// idleInTransactionTimeout makes the server end a session that opened a transaction and
	// went silent (an Edge partitioned mid-transaction), so its row locks do not block the
	// other Edges for longer.
	idleInTransactionTimeout = "60s"
)

// ErrUnreachable is wrapped by Open's error when the database did not answer.
var ErrUnreachable = errors.New("cluster database unreachable")

// Open returns a pool of connections to the cluster's database at dsn, as the Edge edgeID
// (application_name iop-edge:<edgeID>, so an operator's pg_stat_activity says which Edge holds
// which session). It connects once to check that the database answers; the error wraps
// ErrUnreachable when it does not. The error never repeats dsn (it may hold a password).
func Open(ctx context.Context, dsn, edgeID string, log *slog.Logger) (*pgxpool.Pool, error) {
	cfg, err := Config(dsn, edgeID)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("clusterdb: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, cfg.ConnConfig.ConnectTimeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%w: %s:%d: %w", ErrUnreachable, cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	if log != nil {
		log.Info("cluster database connected", "host", cfg.ConnConfig.Host, "port", cfg.ConnConfig.Port,
			"database", cfg.ConnConfig.Database, "application_name", cfg.ConnConfig.RuntimeParams["application_name"])
	}
	return pool, nil
}

// Config parses dsn into the pool configuration Open uses; a test or a tool that needs a
// single connection (LISTEN) takes ConnConfig from it. What the DSN sets explicitly
// (connect_timeout, pool_max_conns, application_name) wins over the defaults here.
func Config(dsn, edgeID string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgconn's ParseConfigError quotes the connection string: do not pass it on.
		return nil, errors.New("clusterdb: the database URL does not parse (the value is not repeated here: it may hold a password)")
	}
	// pgxpool leaves no trace of an explicit pool_max_conns but its value.
	if !strings.Contains(dsn, "pool_max_conns") {
		cfg.MaxConns = MaxConns
	}
	cfg.MaxConnIdleTime = 5 * time.Minute
	cfg.HealthCheckPeriod = 10 * time.Second
	cc := cfg.ConnConfig
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = ConnectTimeout
	}
	cc.DialFunc = (&net.Dialer{
		Timeout: cc.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount,
		},
	}).DialContext
	if _, ok := cc.RuntimeParams["application_name"]; !ok {
		cc.RuntimeParams["application_name"] = ApplicationName(edgeID)
	}
	if _, ok := cc.RuntimeParams["idle_in_transaction_session_timeout"]; !ok {
		cc.RuntimeParams["idle_in_transaction_session_timeout"] = idleInTransactionTimeout
	}
	return cfg, nil
}

// ApplicationName is the application_name of the Edge edgeID's sessions.
func ApplicationName(edgeID string) string {
	name := "iop-edge:" + edgeID
	// PostgreSQL truncates application_name to 63 bytes (NAMEDATALEN-1).
	if len(name) > 63 {
		name = name[:63]
	}
	return name
}

// Unreachable reports whether err says the database could not be reached or went away (no
// connection, a timeout, a server shutting down or refusing connections), as opposed to an
// answer from a reachable database (a constraint, a missing row): the errors on which an Edge
// fails static.
func Unreachable(err error) bool {
	if err == nil || errors.Is(err, pgx.ErrNoRows) || errors.Is(err, pgx.ErrTooManyRows) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08"): // connection_exception
			return true
		case pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
			return true
		case pe.Code == "53300": // too_many_connections
			return true
		}
		return false
	}
	// Anything that is not the server's answer: a dial, a read or a write that failed, a
	// deadline, a closed connection or pool.
	return true
}
