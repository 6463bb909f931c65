// Package pgtest starts a real, temporary PostgreSQL for tests: Debian's
// binaries (initdb and postgres from the newest /usr/lib/postgresql/*/bin),
// a data directory and unix socket in a fresh temporary directory, a free
// loopback TCP port, fsync off. Nothing is mocked: the tests of the Edge's
// shared state run against the server the cluster will use.
//
// Two ways to use it:
//
//   - Start(t) gives a test a fresh, empty database on a server shared by
//     every test of the package. The shared server is started on first use
//     and stopped by Main, so a package that calls Start has
//
//     func TestMain(m *testing.M) { pgtest.Main(m) }
//
//   - NewServer(t) starts a server of the test's own, removed when the test
//     ends. Its Stop and Start let a test take the database away ("the
//     database stopped for a minute") without disturbing other tests.
//
// PostgreSQL refuses to run as root, so when the test process is root the
// server runs as the system user iop-pg, created with useradd when missing.
// Without any PostgreSQL binaries the tests skip, unless IOP_REQUIRE_POSTGRES
// is set (CI sets it): then they fail, so a CI image that lost the package
// cannot pass by skipping.
package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
)

// RequireEnv is the environment variable that turns "no PostgreSQL here"
// from a skip into a failure.
const RequireEnv = "IOP_REQUIRE_POSTGRES"

// Main runs the package's tests and then stops the shared server that Start
// used, so no postgres process or data directory outlives the test binary.
// Call it from TestMain.
func Main(m *testing.M) {
	mainCalled.Store(true)
	code := m.Run()
	sharedMu.Lock()
	if shared != nil {
		shared.shutdown()
	}
	sharedMu.Unlock()
	os.Exit(code)
}

var (
	mainCalled atomic.Bool

	sharedOnce sync.Once
	sharedMu   sync.Mutex
	shared     *Server
	sharedErr  error
)

// Start returns the DSN of a fresh, empty database on the package's shared
// server, starting the server on first use. The database is dropped when the
// test ends. The package's TestMain must call Main (Start fails the test
// otherwise: the shared server would outlive the test binary).
func Start(t testing.TB) string {
	t.Helper()
	if !mainCalled.Load() {
		t.Fatal("pgtest.Start needs the package's TestMain to call pgtest.Main(m), which stops the shared server")
	}
	bin := binDir(t)
	sharedOnce.Do(func() {
		s, err := start(bin)
		sharedMu.Lock()
		shared, sharedErr = s, err
		sharedMu.Unlock()
	})
	sharedMu.Lock()
	s, err := shared, sharedErr
	sharedMu.Unlock()
	if err != nil {
		t.Fatalf("pgtest: the shared PostgreSQL did not start: %v", err)
	}
	return s.CreateDatabase(t)
}

// NewServer starts a PostgreSQL of the test's own, stopped and removed when
// the test ends. Use it when the test stops and starts the server.
func NewServer(t testing.TB) *Server {
	t.Helper()
	s, err := start(binDir(t))
	if err != nil {
		t.Fatalf("pgtest: PostgreSQL did not start: %v", err)
	}
	t.Cleanup(s.shutdown)
	return s
}

// CreateDatabase creates a fresh, empty database on s and returns its DSN;
// the database is dropped when the test ends (if the server is still up).
func (s *Server) CreateDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d", s.dbSeq.Add(1))
	if err := s.admin(context.Background(), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		// FORCE ends connections a test left open; a stopped server keeps
		// the database until it is removed as a whole.
		_ = s.admin(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	return s.DSN(name)
}
