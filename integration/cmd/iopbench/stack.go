package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// nodeID and providerName name the one Node and its Ollama provider.
const (
	nodeID       = "bench-node"
	providerName = "ollama"
)

// stack is the system under measurement: the fake Ollama in this process,
// and edged and noded (with its plugin children) as processes, connected
// over loopback QUIC as in configs/edge-dev.yaml and node-dev.yaml.
type stack struct {
	dir  string // temporary: binaries, configs, daemon logs
	fake *fakeollama.Server
	base string // the Edge's HTTP API, http://127.0.0.1:PORT
	edge *daemon
	node *daemon
}

// daemon is an IOP process started by the bench.
type daemon struct {
	name string
	cmd  *exec.Cmd
	log  string // file holding its stdout and stderr
	done chan struct{}
	err  error // set before done is closed
}

// buildBinaries builds edged and noded into dir. The current directory must
// be inside the module.
func buildBinaries(ctx context.Context, dir string) (edged, noded string, err error) {
	edged, noded = filepath.Join(dir, "edged"), filepath.Join(dir, "noded")
	for _, b := range []struct{ out, pkg string }{
		{edged, "github.com/iop-dev/iop/edged"}, {noded, "github.com/iop-dev/iop/noded"},
	} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b.out, b.pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
		}
	}
	return edged, noded, nil
}

// startStack starts the fake with models, then edged and noded from
// loopback configs, and waits until the Node is ready with its provider
// online and serving every model. capacity is the provider's capacity.
func startStack(ctx context.Context, dir, edgedBin, nodedBin string, capacity int, models []fakeollama.Model) (_ *stack, err error) {
	s := &stack{dir: dir, fake: fakeollama.New(models...)}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	quicPort, err := freePort("udp")
	if err != nil {
		return nil, err
	}
	httpPort, err := freePort("tcp")
	if err != nil {
		return nil, err
	}
	s.base = fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	// The default profile's timers, written out: a deadline and an idle
	// timeout far above any workload, and a queue as deep as the capacity.
	edgeConf := fmt.Sprintf(`edge_id: bench-edge
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api: {allow_anonymous: true}
profiles:
  - {name: default, deadline: 10m, queue_timeout: 30s, max_queue_depth: %d, idle_timeout: 2m}
`, quicPort, httpPort, capacity)
	nodeConf := fmt.Sprintf(`node_id: %s
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
drain_timeout: 2s
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
providers:
  - {name: %s, adapter: ollama, capacity: %d, config: {base_url: %q}}
`, nodeID, quicPort, providerName, capacity, s.fake.URL())
	for name, body := range map[string]string{"edge.yaml": edgeConf, "node.yaml": nodeConf} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			return nil, err
		}
	}
	if s.edge, err = startDaemon(dir, "edged", edgedBin, "run", "--config", filepath.Join(dir, "edge.yaml")); err != nil {
		return nil, err
	}
	if s.node, err = startDaemon(dir, "noded", nodedBin, "run", "--config", filepath.Join(dir, "node.yaml")); err != nil {
		return nil, err
	}
	want := make([]string, len(models))
	for i, m := range models {
		want[i] = m.Name
	}
	if _, err := s.waitReady(ctx, want); err != nil {
		return nil, err
	}
	return s, nil
}

func startDaemon(dir, name, path string, args ...string) (*daemon, error) {
	d := &daemon{name: name, cmd: exec.Command(path, args...), log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(d.log)
	if err != nil {
		return nil, err
	}
	d.cmd.Stdout, d.cmd.Stderr = f, f
	// Should the bench itself be killed, the daemons go with it.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		d.err = d.cmd.Wait()
		f.Close()
		close(d.done)
	}()
	return d, nil
}

// stop asks the daemon to end (SIGTERM), and kills it after grace.
func (d *daemon) stop(grace time.Duration) {
	if d == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(grace):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// tail is the end of the daemon's log, for error messages.
func (d *daemon) tail() string {
	b, _ := os.ReadFile(d.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// close stops the Node first (it takes its plugins with it), then the Edge
// and the fake. Plugins still alive after the Node are killed by pid.
func (s *stack) close() {
	var plugins []int
	if s.node != nil {
		plugins = childPIDs(s.node.cmd.Process.Pid)
	}
	s.node.stop(5 * time.Second)
	for _, pid := range plugins {
		if alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	s.edge.stop(5 * time.Second)
	if s.fake != nil {
		s.fake.Close()
	}
}

// checkAlive reports a daemon that exited: the run is broken.
func (s *stack) checkAlive() error {
	for _, d := range []*daemon{s.edge, s.node} {
		if d.exited() {
			return fmt.Errorf("%s exited (%v); its log ends:\n%s", d.name, d.err, d.tail())
		}
	}
	return nil
}

// nodeView is the part of the Edge's /admin/v1/nodes the bench reads.
type nodeView struct {
	ID         string `json:"id"`
	Generation uint64 `json:"generation"`
	State      string `json:"state"`
	Providers  []struct {
		Name    string   `json:"name"`
		State   string   `json:"state"`
		Targets []string `json:"targets"`
	} `json:"providers"`
}

// nodeState returns the bench Node as the Edge sees it.
func (s *stack) nodeState(ctx context.Context) (nodeView, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/admin/v1/nodes", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nodeView{}, err
	}
	defer resp.Body.Close()
	var body struct {
		Nodes []nodeView `json:"nodes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nodeView{}, fmt.Errorf("decode /admin/v1/nodes: %w", err)
	}
	for _, n := range body.Nodes {
		if n.ID == nodeID {
			return n, nil
		}
	}
	return nodeView{}, fmt.Errorf("node %s not registered", nodeID)
}

// waitReady polls the admin API until the Node is ready with its provider
// online and listing every model in want.
func (s *stack) waitReady(ctx context.Context, want []string) (nodeView, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var last error
	for {
		n, err := s.nodeState(ctx)
		if err == nil {
			err = fmt.Errorf("node %s is %s, providers %+v", nodeID, n.State, n.Providers)
			if n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online" &&
				containsAll(n.Providers[0].Targets, want) {
				return n, nil
			}
		}
		last = err
		if err := s.checkAlive(); err != nil {
			return nodeView{}, err
		}
		select {
		case <-ctx.Done():
			return nodeView{}, fmt.Errorf("waiting for the node to be ready: %w (last: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// probe sends one short answer through the Edge's Ollama API: the path
// works end to end before anything is measured.
func (s *stack) probe(ctx context.Context, c *http.Client, model string) error {
	body := `{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"probe"}]}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/api/chat", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("probing the Edge's /api/chat: %w", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"done":true`)) {
		return fmt.Errorf("probing the Edge's /api/chat: %d %s", resp.StatusCode, b)
	}
	return nil
}

// freePort returns a port free on 127.0.0.1 for network ("tcp" or "udp").
func freePort(network string) (int, error) {
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// onceErr keeps the first error of concurrent workers.
type onceErr struct {
	mu  sync.Mutex
	err error
}

func (o *onceErr) set(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err == nil && err != nil && !errors.Is(err, context.Canceled) {
		o.err = err
	}
}

func (o *onceErr) get() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}
