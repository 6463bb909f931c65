package pgtest

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

func query(t *testing.T, dsn, sql string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var s string
	err = conn.QueryRow(ctx, sql).Scan(&s)
	return s, err
}

// Each test gets its own empty database on the shared server: a table
// created in one is not seen in another.
func TestStartGivesEachTestAFreshDatabase(t *testing.T) {
	a, b := Start(t), Start(t)
	if a == b {
		t.Fatalf("two Start calls returned the same database %s", a)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE only_in_a (x int)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	got, err := query(t, b, "SELECT coalesce(to_regclass('only_in_a')::text, 'absent')")
	if err != nil {
		t.Fatal(err)
	}
	if got != "absent" {
		t.Fatalf("database b sees a's table: %s", got)
	}
}

// The server does not run as root (PostgreSQL refuses it) and fsync is off.
func TestServerSettings(t *testing.T) {
	dsn := Start(t)
	fsync, err := query(t, dsn, "SHOW fsync")
	if err != nil {
		t.Fatal(err)
	}
	if fsync != "off" {
		t.Errorf("fsync = %s, want off", fsync)
	}
	if os.Geteuid() == 0 {
		sharedMu.Lock()
		s := shared
		sharedMu.Unlock()
		fi, err := os.Stat(s.dataDir())
		if err != nil {
			t.Fatal(err)
		}
		if owner := fi.Sys().(*syscall.Stat_t).Uid; owner == 0 {
			t.Errorf("running as root, the data directory is owned by root, want the %s user", runAsUser)
		}
	}
}

// Stop makes the server refuse connections; Start brings it back on the
// same port with the data kept, as a restarted cluster database would.
func TestStopStartKeepsDataAndPort(t *testing.T) {
	s := NewServer(t)
	dsn := s.CreateDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before stop')"); err != nil {
		t.Fatal(err)
	}
	port := s.Port()

	s.Stop(t)
	if err := conn.Ping(ctx); err == nil {
		t.Fatal("a connection made before Stop still answers")
	}
	conn.Close(ctx)
	if _, err := query(t, dsn, "SELECT 1::text"); err == nil {
		t.Fatal("a stopped server accepted a connection")
	}

	s.Start(t)
	if s.Port() != port {
		t.Fatalf("port moved from %d to %d across a restart", port, s.Port())
	}
	got, err := query(t, dsn, "SELECT v FROM kept")
	if err != nil {
		t.Fatal(err)
	}
	if got != "before stop" {
		t.Fatalf("after restart kept = %q", got)
	}
}

// A server of a test's own is gone (process and directory) after the test.
func TestNewServerIsRemovedAfterTheTest(t *testing.T) {
	var dir string
	var pid int
	t.Run("inner", func(t *testing.T) {
		s := NewServer(t)
		dir = s.dir
		s.mu.Lock()
		pid = s.cmd.Process.Pid
		s.mu.Unlock()
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the server's directory %s is still there (%v)", dir, err)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); !os.IsNotExist(err) {
		t.Errorf("the postmaster (pid %d) is still running", pid)
	}
}

// The newest major version that has both binaries is used; none at all is
// an error that names where it looked.
func TestFindBinTakesTheNewestCompleteVersion(t *testing.T) {
	root := t.TempDir()
	for _, v := range []struct {
		version string
		files   []string
	}{
		{"9.6", []string{"initdb", "postgres"}},
		{"15", []string{"initdb", "postgres"}},
		{"16", []string{"initdb"}}, // no server: a client-only install
		{"notes", []string{"initdb", "postgres"}},
	} {
		bin := filepath.Join(root, v.version, "bin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range v.files {
			if err := os.WriteFile(filepath.Join(bin, f), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := findBinIn(root)
	if err != nil || got != filepath.Join(root, "15", "bin") {
		t.Errorf("findBinIn = %s, %v; want version 15's", got, err)
	}
	empty := t.TempDir()
	if _, err := findBinIn(empty); err == nil || !strings.Contains(err.Error(), empty) {
		t.Errorf("no binaries: %v", err)
	}
}
