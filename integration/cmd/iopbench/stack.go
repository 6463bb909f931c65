package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// nodeID names the one Node; its providers are providerName, then
// providerName-2, -3, … when one provider's capacity is not enough.
const (
	nodeID       = "bench-node"
	providerName = "ollama"
)

// stack is the system under measurement: a fake Ollama, and edged and
// noded (with its plugin children) as processes, connected over loopback
// QUIC as in configs/edge-dev.yaml and node-dev.yaml.
type stack struct {
	dir string // its daemons' configs and logs
	// fake is the fake Ollama in this process, whose records the main
	// workloads read; nil when fakeProc runs it as its own process.
	fake      *fakeollama.Server
	fakeProc  *daemon
	fakeURL   string
	models    []fakeollama.Model
	base      string // the Edge's HTTP API, http://127.0.0.1:PORT
	edge      *daemon
	node      *daemon
	providers int
}

// binaries are the programs the bench builds.
type binaries struct {
	edged, noded string
	fake         string // the fake Ollama as its own program; "" when not built
	floor        string // quicfloor; "" when not built
}

// stackOptions shape a stack's configs.
type stackOptions struct {
	name      string // its subdirectory of the run's directory
	models    []fakeollama.Model
	providers int // ollama providers on the one Node, every one on the fake
	capacity  int // of each provider
	// maxConns is the Edge's limits.max_connections; 0 leaves its default.
	maxConns int
	// queueDepth is the default profile's max_queue_depth.
	queueDepth int
	// deadline and idle are the default profile's deadline and
	// idle_timeout: far above any workload.
	deadline, idle time.Duration
	// fakeProcess runs the fake as its own process, with file
	// descriptors of its own: then this process holds only the client's
	// end of each connection, which a scale workload needs when
	// RLIMIT_NOFILE cannot be raised.
	fakeProcess bool
}

// daemon is an IOP process started by the bench.
type daemon struct {
	name string
	cmd  *exec.Cmd
	log  string // file holding its stdout and stderr
	done chan struct{}
	err  error // set before done is closed
}

// buildOptions say what buildBinaries builds besides edged and noded.
type buildOptions struct {
	fake    bool // the fake's own program
	floor   bool // quicfloor, built as the daemons are
	symbols bool // keep the symbol tables (-profile)
}

// buildBinaries builds edged and noded as the image ships them (static,
// without cgo, symbols stripped: the Dockerfile's build), the fake's own
// program when o.fake, and quicfloor as the daemons when o.floor, into
// dir. The current directory must be inside the module. A cgo build maps
// the C library too, about 1.3 MiB more of each daemon's resident set
// than what ships (issue 25). With o.symbols the daemons keep their symbol
// tables, so that perf can name their functions (-profile); their text is
// laid out as shipped.
func buildBinaries(ctx context.Context, dir string, o buildOptions) (binaries, error) {
	bins := binaries{edged: filepath.Join(dir, "edged"), noded: filepath.Join(dir, "noded")}
	type build struct {
		out, pkg string
		shipped  bool
	}
	builds := []build{
		{bins.edged, "github.com/iop-dev/iop/edged", true}, {bins.noded, "github.com/iop-dev/iop/noded", true},
	}
	if o.fake {
		bins.fake = filepath.Join(dir, "fakeollama")
		builds = append(builds, build{bins.fake, "github.com/iop-dev/iop/internal/fakes/fakeollama/cmd/fakeollama", false})
	}
	if o.floor {
		bins.floor = filepath.Join(dir, "quicfloor")
		builds = append(builds, build{bins.floor, "github.com/iop-dev/iop/integration/cmd/quicfloor", true})
	}
	for _, b := range builds {
		args := []string{"build", "-o", b.out}
		if b.shipped {
			args = append(args, "-trimpath")
			if !o.symbols {
				args = append(args, "-ldflags=-s -w")
			}
		}
		cmd := exec.CommandContext(ctx, "go", append(args, b.pkg)...)
		if b.shipped {
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return binaries{}, fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
		}
	}
	return bins, nil
}

// startStack starts a fake serving o.models, then edged and noded from
// loopback configs in dir/o.name, and waits until the Node is ready with
// every provider online and serving every model.
func startStack(ctx context.Context, dir string, bins binaries, o stackOptions) (_ *stack, err error) {
	dir = filepath.Join(dir, o.name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s := &stack{dir: dir, models: o.models, providers: o.providers}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if o.fakeProcess {
		if err := s.startFakeProcess(ctx, bins.fake); err != nil {
			return nil, err
		}
	} else {
		s.fake = fakeollama.New(o.models...)
		s.fakeURL = s.fake.URL()
	}
	quicPort, err := freePort("udp")
	if err != nil {
		return nil, err
	}
	httpPort, err := freePort("tcp")
	if err != nil {
		return nil, err
	}
	s.base = fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	limits := ""
	if o.maxConns > 0 {
		limits = fmt.Sprintf("limits: {max_connections: %d}\n", o.maxConns)
	}
	// The default profile's timers, written out: a deadline and an idle
	// timeout far above any workload, and a queue as deep as the capacity.
	edgeConf := fmt.Sprintf(`edge_id: bench-edge
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api: {allow_anonymous: true}
%sprofiles:
  - {name: default, deadline: %s, queue_timeout: 30s, max_queue_depth: %d, idle_timeout: %s}
`, quicPort, httpPort, limits, o.deadline, o.queueDepth, o.idle)
	nodeConf := fmt.Sprintf(`node_id: %s
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
drain_timeout: 2s
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
providers:
`, nodeID, quicPort)
	for i := range o.providers {
		nodeConf += fmt.Sprintf("  - {name: %s, adapter: ollama, capacity: %d, config: {base_url: %q}}\n",
			providerID(i), o.capacity, s.fakeURL)
	}
	for name, body := range map[string]string{"edge.yaml": edgeConf, "node.yaml": nodeConf} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			return nil, err
		}
	}
	if s.edge, err = startDaemon(dir, "edged", bins.edged, "run", "--config", filepath.Join(dir, "edge.yaml")); err != nil {
		return nil, err
	}
	if s.node, err = startDaemon(dir, "noded", bins.noded, "run", "--config", filepath.Join(dir, "node.yaml")); err != nil {
		return nil, err
	}
	want := make([]string, len(o.models))
	for i, m := range o.models {
		want[i] = m.Name
	}
	if _, err := s.waitReady(ctx, want); err != nil {
		return nil, err
	}
	return s, nil
}

// startFakeProcess runs the fake as its own process, serving s.models,
// and waits until it listens.
func (s *stack) startFakeProcess(ctx context.Context, bin string) error {
	if bin == "" {
		return errors.New("the fake's program was not built")
	}
	b, err := json.Marshal(s.models)
	if err != nil {
		return err
	}
	models := filepath.Join(s.dir, "models.json")
	if err := os.WriteFile(models, b, 0o600); err != nil {
		return err
	}
	if s.fakeProc, err = startDaemon(s.dir, "fakeollama", bin, "-addr", "127.0.0.1:0", "-models", models); err != nil {
		return err
	}
	s.fakeURL, err = s.fakeProc.waitLine(ctx, "listening on ")
	return err
}

// waitLine waits up to 30 s for d to log a line that starts with prefix,
// and returns the rest of that line. It gives up at once when d exits, or
// one of also, the processes d's line waits on.
func (d *daemon) waitLine(ctx context.Context, prefix string, also ...*daemon) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		out, _ := os.ReadFile(d.log)
		for line := range strings.SplitSeq(string(out), "\n") {
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				return strings.TrimSpace(rest), nil
			}
		}
		if d.exited() {
			return "", fmt.Errorf("%s exited (%v): %s", d.name, d.err, out)
		}
		for _, o := range also {
			if o.exited() {
				return "", fmt.Errorf("%s exited (%v) while %s waited for it; its log ends:\n%s", o.name, o.err, d.name, o.tail())
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for %s to log %q: %w", d.name, prefix, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// fakeRequests returns the fake's records.
func (s *stack) fakeRequests(ctx context.Context) ([]fakeollama.Request, error) {
	if s.fake != nil {
		return s.fake.Requests(), nil
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.fakeURL+"/_fake/requests", nil)
	c := &http.Client{Timeout: time.Minute}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var reqs []fakeollama.Request
	if err := json.NewDecoder(resp.Body).Decode(&reqs); err != nil {
		return nil, fmt.Errorf("GET /_fake/requests: %w", err)
	}
	return reqs, nil
}

// providerID names the Node's i-th provider.
func providerID(i int) string {
	if i == 0 {
		return providerName
	}
	return fmt.Sprintf("%s-%d", providerName, i+1)
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

// tailLines is the last n lines of the daemon's log, each cut to 300
// bytes.
func (d *daemon) tailLines(n int) []string {
	b, _ := os.ReadFile(d.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	lines = lines[max(len(lines)-n, 0):]
	for i, l := range lines {
		if len(l) > 300 {
			lines[i] = l[:300] + "…"
		}
	}
	return lines
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
	s.fakeProc.stop(5 * time.Second)
}

// checkAlive reports a daemon that exited: the run is broken.
func (s *stack) checkAlive() error { return checkAlive(s.edge, s.node, s.fakeProc) }

// checkAlive reports the first of ds that exited, with its log's end; a
// nil daemon (one not started) is skipped.
func checkAlive(ds ...*daemon) error {
	for _, d := range ds {
		if d != nil && d.exited() {
			return fmt.Errorf("%s exited (%v); its log ends:\n%s", d.name, d.err, d.tail())
		}
	}
	return nil
}

// nodeView is the part of the Edge's /admin/v1/nodes the bench reads
// (internal/edge/fleet.NodeView).
type nodeView struct {
	ID         string `json:"id"`
	Generation uint64 `json:"generation"`
	State      string `json:"state"`
	// LastHeartbeatRTTMillis is the round trip of the last heartbeat the
	// Edge sent that the Node answered; absent before the first.
	LastHeartbeatRTTMillis *float64   `json:"last_heartbeat_rtt_ms"`
	LastHeartbeatAt        *time.Time `json:"last_heartbeat_at"`
	Suspect                bool       `json:"suspect"`
	Providers              []struct {
		Name    string   `json:"name"`
		State   string   `json:"state"`
		Targets []string `json:"targets"`
	} `json:"providers"`
}

// nodeState returns the bench Node as the Edge sees it.
func (s *stack) nodeState(ctx context.Context) (nodeView, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/admin/v1/nodes", nil)
	resp, err := adminClient.Do(req)
	if err != nil {
		return nodeView{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nodeView{}, fmt.Errorf("GET /admin/v1/nodes: %s", resp.Status)
	}
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

// adminClient reads the Edge's admin API on connections of its own, so
// that a poll never waits behind a workload's.
var adminClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 2}}

// waitReady polls the admin API until the Node is ready with every
// provider online and listing every model in want.
func (s *stack) waitReady(ctx context.Context, want []string) (nodeView, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var last error
	for {
		n, err := s.nodeState(ctx)
		if err == nil {
			err = fmt.Errorf("node %s is %s, providers %+v", nodeID, n.State, n.Providers)
			ready := n.State == "ready" && len(n.Providers) == s.providers
			for _, p := range n.Providers {
				ready = ready && p.State == "online" && containsAll(p.Targets, want)
			}
			if ready {
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

// probe sends one short answer through each of the Edge's APIs in apis:
// every path works end to end before anything is measured.
func (s *stack) probe(ctx context.Context, c *http.Client, model string, apis []apiSpec) error {
	for _, a := range apis {
		r, err := stream(ctx, c, side{name: a.Label, api: a, base: s.base}, model, "probe", false)
		if err == nil && r.tokens != 1 {
			err = fmt.Errorf("%s: %d tokens, want 1", a.Label, r.tokens)
		}
		if err != nil {
			return fmt.Errorf("probing the Edge's %s: %w", a.Path, err)
		}
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
