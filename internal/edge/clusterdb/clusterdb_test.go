package clusterdb

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/iop-dev/iop/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func open(t *testing.T, dsn, edgeID string) *pgxpool.Pool {
	t.Helper()
	pool, err := Open(context.Background(), dsn, edgeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Every session says which Edge holds it, for an operator's pg_stat_activity.
func TestOpenNamesTheEdge(t *testing.T) {
	pool := open(t, pgtest.Start(t), "edge-a")
	var name, idle string
	if err := pool.QueryRow(context.Background(),
		"SELECT current_setting('application_name'), current_setting('idle_in_transaction_session_timeout')").Scan(&name, &idle); err != nil {
		t.Fatal(err)
	}
	if name != "iop-edge:edge-a" {
		t.Errorf("application_name = %q, want iop-edge:edge-a", name)
	}
	if idle != "1min" {
		t.Errorf("idle_in_transaction_session_timeout = %q, want 1min", idle)
	}
}

// A DSN's own settings win over the defaults.
func TestConfigKeepsWhatTheDSNSets(t *testing.T) {
	cfg, err := Config("postgres://u@db.example:5432/iop?application_name=mine&connect_timeout=2&pool_max_conns=3", "e")
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.ConnConfig.RuntimeParams["application_name"]; got != "mine" {
		t.Errorf("application_name = %q, want the DSN's", got)
	}
	if cfg.ConnConfig.ConnectTimeout != 2*time.Second {
		t.Errorf("connect timeout = %v, want the DSN's 2s", cfg.ConnConfig.ConnectTimeout)
	}
	if cfg.MaxConns != 3 {
		t.Errorf("max conns = %d, want the DSN's 3", cfg.MaxConns)
	}
	cfg, err = Config("postgres://u@db.example/iop", "e")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ConnConfig.ConnectTimeout != ConnectTimeout || cfg.MaxConns != MaxConns {
		t.Errorf("defaults: connect timeout %v, max conns %d", cfg.ConnConfig.ConnectTimeout, cfg.MaxConns)
	}
}

// An unreachable database is said so, quickly, and the password is not repeated.
func TestOpenUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	start := time.Now()
	_, err = Open(context.Background(), "postgres://u:hunter2@"+addr+"/iop?sslmode=disable", "e", nil)
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("err = %v, want ErrUnreachable", err)
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("the error repeats the password: %v", err)
	}
	if d := time.Since(start); d > ConnectTimeout+time.Second {
		t.Errorf("Open took %v to fail", d)
	}
	if !Unreachable(err) {
		t.Errorf("Unreachable(%v) = false", err)
	}
	if _, err := Config("postgres://u:hunter2@[bad", "e"); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a DSN that does not parse: %v", err)
	}
}

func TestUnreachableTellsAnswersFromSilence(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{pgx.ErrNoRows, false},
		{fmt.Errorf("wrapped: %w", pgx.ErrNoRows), false},
		{&pgconn.PgError{Code: "23505"}, false}, // unique_violation: the database answered
		{&pgconn.PgError{Code: "40001"}, false}, // serialization_failure
		{&pgconn.PgError{Code: "08006"}, true},  // connection_failure
		{&pgconn.PgError{Code: "57P01"}, true},  // admin_shutdown
		{&pgconn.PgError{Code: "57P03"}, true},  // cannot_connect_now
		{&pgconn.PgError{Code: "53300"}, true},  // too_many_connections
		{context.DeadlineExceeded, true},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
	} {
		if got := Unreachable(tc.err); got != tc.want {
			t.Errorf("Unreachable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func count(t *testing.T, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Each step runs once; a later release's new step runs alone.
func TestMigrateAppliesEachStepOnce(t *testing.T) {
	ctx := context.Background()
	pool := open(t, pgtest.Start(t), "e")
	steps := []string{
		"CREATE TABLE runs (n int); INSERT INTO runs VALUES (1)",
	}
	for range 2 {
		if err := Migrate(ctx, pool, "c", steps); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, pool, "SELECT count(*) FROM runs"); n != 1 {
		t.Fatalf("step 1 ran %d times", n)
	}
	steps = append(steps, "INSERT INTO runs VALUES (2)")
	if err := Migrate(ctx, pool, "c", steps); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, "SELECT count(*) FROM runs"); n != 2 {
		t.Fatalf("after step 2: %d rows, want 2", n)
	}
	if v, err := Version(ctx, pool, "c"); err != nil || v != 2 {
		t.Fatalf("Version = %d, %v; want 2", v, err)
	}
	// An older Edge (one step) on the newer database: accepted, nothing run.
	if err := Migrate(ctx, pool, "c", steps[:1]); err != nil {
		t.Fatal(err)
	}
	if v, _ := Version(ctx, pool, "c"); v != 2 {
		t.Fatalf("an older Edge moved the version to %d", v)
	}
	if v, err := Version(ctx, pool, "other"); err != nil || v != 0 {
		t.Fatalf("Version of an unknown component = %d, %v", v, err)
	}
}

// Version on a database no Edge has touched is 0, not an error.
func TestVersionOfAnEmptyDatabase(t *testing.T) {
	pool := open(t, pgtest.Start(t), "e")
	if v, err := Version(context.Background(), pool, "c"); err != nil || v != 0 {
		t.Fatalf("Version = %d, %v", v, err)
	}
}

// A failing step leaves the database as it was: no half-applied release.
func TestMigrateFailingStepChangesNothing(t *testing.T) {
	ctx := context.Background()
	pool := open(t, pgtest.Start(t), "e")
	err := Migrate(ctx, pool, "c", []string{"CREATE TABLE first (n int)", "THIS IS NOT SQL"})
	if err == nil || !strings.Contains(err.Error(), "step 2") {
		t.Fatalf("err = %v, want step 2's", err)
	}
	if n := count(t, pool, "SELECT count(*) FROM pg_tables WHERE tablename = 'first'"); n != 0 {
		t.Fatal("step 1's table stayed after step 2 failed")
	}
	if v, _ := Version(ctx, pool, "c"); v != 0 {
		t.Fatalf("version = %d after a failed migration", v)
	}
}

// Edges that start at the same moment do not race: every step still runs
// once, and none of them fails.
func TestMigrateConcurrentEdges(t *testing.T) {
	dsn := pgtest.Start(t)
	steps := []string{
		"CREATE TABLE runs (n int)",
		"INSERT INTO runs VALUES (1)",
	}
	const edges = 8
	var wg sync.WaitGroup
	errs := make([]error, edges)
	for i := range edges {
		pool := open(t, dsn, fmt.Sprintf("e%d", i))
		wg.Go(func() { errs[i] = Migrate(context.Background(), pool, "c", steps) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("edge %d: %v", i, err)
		}
	}
	pool := open(t, dsn, "check")
	if n := count(t, pool, "SELECT count(*) FROM runs"); n != 1 {
		t.Fatalf("the insert step ran %d times across %d Edges", n, edges)
	}
}
