// Package integration runs the real daemons as separate processes over real
// QUIC on 127.0.0.1: the binaries are built once per test run.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

var bin struct {
	dir                            string
	edged, dev, noded, testadapter string
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "iop-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin.dir = dir
	bin.edged, bin.dev = filepath.Join(dir, "edged"), filepath.Join(dir, "dev")
	bin.noded, bin.testadapter = filepath.Join(dir, "noded"), filepath.Join(dir, "testadapter")
	for _, b := range []struct{ out, pkg string }{
		{bin.edged, "../edged"}, {bin.dev, "../edged/dev"}, {bin.noded, "../noded"},
		{bin.testadapter, "../internal/testadapter/cmd/testadapter"},
	} {
		cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building", b.pkg, ":", err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a daemon started by a test.
type proc struct {
	t       *testing.T
	name    string
	cmd     *exec.Cmd
	out     *lockedBuffer
	done    chan struct{}
	waitErr error
}

// start runs a daemon; it is killed at the end of the test if still running.
func start(t *testing.T, name, path string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, cmd: exec.Command(path, args...), out: new(lockedBuffer), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+cacheHome(t))
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.out)
		}
	})
	return p
}

// cacheHomes is each test's cache directory (cacheHome).
var cacheHomes sync.Map // *testing.T → string

// cacheHome is t's own XDG_CACHE_HOME for the daemons it starts. An Edge
// without data_dir remembers what it served in the user's cache directory,
// keyed by its id and QUIC address (served.CachePath); a test's Edge that
// got a port an earlier test's Edge of the same id had would otherwise
// list that Edge's models as reconnecting. The daemons of one test (an
// Edge and its restart) share it.
func cacheHome(t *testing.T) string {
	if dir, ok := cacheHomes.Load(t); ok {
		return dir.(string)
	}
	dir := t.TempDir()
	t.Cleanup(func() { cacheHomes.Delete(t) })
	actual, _ := cacheHomes.LoadOrStore(t, dir)
	return actual.(string)
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.t.Fatalf("%s did not exit 30s after SIGTERM", p.name)
	}
	if p.waitErr != nil {
		p.t.Fatalf("%s exited with %v after SIGTERM:\n%s", p.name, p.waitErr, p.out)
	}
}

// waitOutput waits until the process output matches re and returns the
// first submatch.
func (p *proc) waitOutput(re *regexp.Regexp) string {
	p.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(p.out.String()); m != nil {
			if len(m) > 1 {
				return m[1]
			}
			return m[0]
		}
		select {
		case <-p.done:
			p.t.Fatalf("%s exited (%v) before printing %s:\n%s", p.name, p.waitErr, re, p.out)
		case <-time.After(20 * time.Millisecond):
		}
	}
	p.t.Fatalf("%s did not print %s within 30s:\n%s", p.name, re, p.out)
	return ""
}

// freePort returns a port free on 127.0.0.1 for network ("tcp" or "udp").
func freePort(t *testing.T, network string) int {
	t.Helper()
	return pickPort(t, network, "127.0.0.1")
}

// pickPort returns a port free for network on host, chosen below the
// kernel's ephemeral range: a port from that range could be handed to any
// new socket (a Node dialling, a client, another test) between this check
// and the daemon's bind, and the daemon would fail with "address already
// in use". Ports below it are only ever taken by a bind that names them.
func pickPort(t *testing.T, network, host string) int {
	t.Helper()
	low := ephemeralLow()
	for range 200 {
		port := 10000 + rand.IntN(low-10000)
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		if network == "udp" {
			c, err := net.ListenPacket("udp", addr)
			if err != nil {
				continue
			}
			c.Close()
			return port
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		l.Close()
		return port
	}
	t.Fatalf("no free %s port on %s below %d", network, host, low)
	return 0
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768
// when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 11000 {
				return n
			}
		}
	}
	return 32768
}

// nodeView is the part of /admin/v1/nodes the tests read.
type nodeView struct {
	ID          string   `json:"id"`
	Generation  uint64   `json:"generation"`
	State       string   `json:"state"`
	Identity    string   `json:"identity"`
	FenceReason string   `json:"fence_reason"`
	RTT         *float64 `json:"last_heartbeat_rtt_ms"`
	Providers   []struct {
		Name             string            `json:"name"`
		State            string            `json:"state"`
		Targets          []string          `json:"targets"`
		UnhealthyTargets []string          `json:"unhealthy_targets"`
		Stalls           map[string]uint64 `json:"stalls"`
	} `json:"providers"`
}

func adminNodes(t *testing.T, base string) []nodeView {
	t.Helper()
	resp, err := http.Get(base + "/admin/v1/nodes")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var body struct {
		Nodes []nodeView `json:"nodes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("decode /admin/v1/nodes: %v", err)
	}
	return body.Nodes
}

// waitNode polls the admin API until node id satisfies cond.
func waitNode(t *testing.T, base, id string, what string, cond func(nodeView) bool) nodeView {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last []nodeView
	for time.Now().Before(deadline) {
		last = adminNodes(t, base)
		for _, n := range last {
			if n.ID == id && cond(n) {
				return n
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("node %s never became %s; last view: %+v", id, what, last)
	return nodeView{}
}

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// run runs a command to completion and returns its combined output.
func run(t *testing.T, dir, path string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor polls cond for up to 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// workOf is f's requests less the Node's own reads of what the server
// holds loaded (/api/ps, issue 23), which come after runs end and at
// relists: what a test counts as work sent to the server.
func workOf(f *fakeollama.Server) []fakeollama.Request {
	var out []fakeollama.Request
	for _, r := range f.Requests() {
		if r.Path != "/api/ps" {
			out = append(out, r)
		}
	}
	return out
}
