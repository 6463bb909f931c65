package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// runAsUser is the system user the server runs as when the tests run as
// root (initdb and postgres refuse root).
const runAsUser = "iop-pg"

// readyTimeout bounds how long a starting server may take to accept
// connections; a loaded CI machine takes a few seconds.
const readyTimeout = 60 * time.Second

// Server is one running temporary PostgreSQL. Its superuser is "postgres",
// with trust authentication on loopback and on its socket.
type Server struct {
	bin  string // directory of initdb and postgres
	dir  string // temporary directory: data/, the socket, postgres.log
	port int
	cred *syscall.Credential // nil: run as the test process's user

	dbSeq atomic.Int64

	mu   sync.Mutex
	cmd  *exec.Cmd     // the running postmaster, nil while stopped
	done chan struct{} // closed when cmd has exited
}

// DSN returns the URL of database on s, over loopback TCP (so a stopped
// server refuses connections the way an unreachable one does).
func (s *Server) DSN(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, database)
}

// Port is the server's loopback TCP port; it stays the same across Stop and
// Start.
func (s *Server) Port() int { return s.port }

// Stop shuts the server down (a fast shutdown: sessions are ended, clients
// see their connections close) and waits for it. Connections are refused
// until Start.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if err := s.stop(); err != nil {
		t.Fatalf("pgtest: stop: %v", err)
	}
}

// Start starts a stopped server again, on the same data directory and port,
// and waits until it accepts connections.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	if err := s.run(); err != nil {
		t.Fatalf("pgtest: start: %v", err)
	}
}

// binDir finds the newest PostgreSQL's binaries, or skips the test (fails
// it when RequireEnv is set).
func binDir(t testing.TB) string {
	t.Helper()
	bin, err := findBin()
	if err == nil {
		return bin
	}
	if os.Getenv(RequireEnv) != "" {
		t.Fatalf("pgtest: %v, and %s is set", err, RequireEnv)
	}
	t.Skipf("pgtest: %v (install Debian's postgresql package; %s=1 makes this a failure)", err, RequireEnv)
	return ""
}

// debianRoot is where Debian's postgresql packages put each major
// version's binaries (ROOT/VERSION/bin).
const debianRoot = "/usr/lib/postgresql"

func findBin() (string, error) { return findBinIn(debianRoot) }

// findBinIn returns the bin directory of the newest major version under
// root that has both initdb and postgres.
func findBinIn(root string) (string, error) {
	dirs, _ := filepath.Glob(filepath.Join(root, "*", "bin"))
	type cand struct {
		dir     string
		version float64
	}
	var found []cand
	for _, d := range dirs {
		v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(d)), 64)
		if err != nil {
			continue
		}
		if !executable(filepath.Join(d, "initdb")) || !executable(filepath.Join(d, "postgres")) {
			continue
		}
		found = append(found, cand{d, v})
	}
	if len(found) == 0 {
		return "", fmt.Errorf("no PostgreSQL binaries (initdb, postgres) under %s/*/bin", root)
	}
	sort.Slice(found, func(i, j int) bool { return found[i].version > found[j].version })
	return found[0].dir, nil
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// start creates a data directory with initdb and starts postgres on it.
func start(bin string) (*Server, error) {
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "iop-pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, cred: cred}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			s.remove()
			return nil, fmt.Errorf("chown %s to %s: %w", dir, runAsUser, err)
		}
	}
	initdb := s.command(filepath.Join(bin, "initdb"),
		"-D", s.dataDir(), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C",
		"--no-sync", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		s.remove()
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	// A free port can be taken between choosing it and postgres binding it:
	// a few tries.
	for try := 0; ; try++ {
		if s.port, err = freePort(); err != nil {
			s.remove()
			return nil, err
		}
		err = s.run()
		if err == nil {
			return s, nil
		}
		if try == 2 || !strings.Contains(err.Error(), "could not create") {
			s.remove()
			return nil, err
		}
	}
}

// credential returns the user to run PostgreSQL as: nil (ourselves) unless
// we are root, then iop-pg, created as a system user when missing.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(runAsUser)
	if err != nil {
		out, addErr := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", runAsUser).CombinedOutput()
		// Another test binary may have created it at the same moment:
		// look again before reporting useradd's failure.
		if u, err = user.Lookup(runAsUser); err != nil {
			return nil, fmt.Errorf("the tests run as root and PostgreSQL refuses root; creating the user %s failed: %v: %s", runAsUser, addErr, bytes.TrimSpace(out))
		}
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }
func (s *Server) logPath() string { return filepath.Join(s.dir, "postgres.log") }

// command prepares a PostgreSQL binary to run as the server's user. The
// parent-death signal ends the server if the test binary dies without
// cleaning up (a panic, a test timeout), so no postgres outlives it.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	return cmd
}

// run starts the postmaster and waits until it accepts connections.
func (s *Server) run() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("already running")
	}
	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := s.command(filepath.Join(s.bin, "postgres"),
		"-D", s.dataDir(),
		"-p", strconv.Itoa(s.port),
		"-k", s.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=300",
		"-c", "shared_buffers=32MB",
		"-c", "log_min_messages=warning",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err == nil {
			_ = conn.Close(ctx)
			s.cmd, s.done = cmd, done
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("postgres exited while starting: %s", s.logTail())
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("postgres did not accept connections within %s: %v: %s", readyTimeout, err, s.logTail())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop asks for a fast shutdown and waits; a server that does not stop in
// time is killed.
func (s *Server) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
		return nil
	case <-time.After(30 * time.Second):
		// The whole process group: the postmaster and its backends.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return fmt.Errorf("postgres did not shut down within 30s; killed: %s", s.logTail())
	}
}

// shutdown stops the server and removes its directory.
func (s *Server) shutdown() {
	_ = s.stop()
	s.remove()
}

func (s *Server) remove() { _ = os.RemoveAll(s.dir) }

// admin runs one statement as the superuser in the postgres database.
func (s *Server) admin(ctx context.Context, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// logTail is the end of the server's log, for start failures.
func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.logPath())
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}
