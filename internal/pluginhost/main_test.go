package pluginhost_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/internal/testadapter"
	"github.com/iop-dev/iop/sdk"
	"go.uber.org/goleak"
)

// adapterBin is the test adapter binary TestMain builds.
var adapterBin string

// helperEnv re-executes the test binary as a helper process (see
// runHelper) instead of running tests.
const helperEnv = "IOP_PLUGINHOST_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		runHelper(mode, os.Getenv("IOP_TEST_ADAPTER_BIN"))
		return
	}
	dir, err := os.MkdirTemp("", "pluginhost-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	adapterBin = filepath.Join(dir, "testadapter")
	build := exec.Command("go", "build", "-o", adapterBin, "github.com/iop-dev/iop/internal/testadapter/cmd/testadapter")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the test adapter: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		// Every test closed what it started: no goroutine of a plugin
		// client, log sink or stream is left.
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines leaked: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// runHelper is a small host process for the tests that kill a host:
//
//	host: starts the adapter with pluginhost.Start (Pdeathsig set)
//	raw:  starts the adapter with plain exec, so only the adapter's own
//	      parent watch can end it
//
// It prints the adapter's pid and waits to be killed.
func runHelper(mode, bin string) {
	var pid int
	switch mode {
	case "host":
		p, err := pluginhost.Start(context.Background(), pluginhost.Options{Cmd: exec.Command(bin)})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		pid = p.Pid()
	case "raw":
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(),
			pluginpb.MagicCookieKey+"="+pluginpb.MagicCookieValue,
			fmt.Sprintf("PLUGIN_PROTOCOL_VERSIONS=%d", pluginpb.ProtocolVersion))
		cmd.Stdout = io.Discard
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		pid = cmd.Process.Pid
	default:
		fmt.Fprintln(os.Stderr, "unknown helper mode", mode)
		os.Exit(1)
	}
	fmt.Println(pid)
	select {}
}

// startHelper runs the test binary as a helper host and returns it and the
// pid of the adapter it started.
func startHelper(t *testing.T, mode string) (*exec.Cmd, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "IOP_TEST_ADAPTER_BIN="+adapterBin)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper printed no pid: %v", err)
	}
	var pid int
	if _, err := fmt.Sscan(strings.TrimSpace(line), &pid); err != nil {
		t.Fatalf("helper printed %q: %v", line, err)
	}
	return cmd, pid
}

// host starts a plugin for a test; the table of hosts runs each behaviour
// test both in process and as a real plugin process.
type host struct {
	name  string
	start func(t *testing.T, minimal bool) (*pluginhost.Plugin, *logRecorder)
}

var hosts = []host{
	{"in-process", startInProcess},
	{"process", startProcess},
}

func startInProcess(t *testing.T, minimal bool) (*pluginhost.Plugin, *logRecorder) {
	t.Helper()
	var a sdk.Adapter = testadapter.New()
	if minimal {
		a = testadapter.NewMinimal()
	}
	p, err := pluginhost.StartInProcess(t.Context(), a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p, &logRecorder{}
}

func startProcess(t *testing.T, minimal bool) (*pluginhost.Plugin, *logRecorder) {
	t.Helper()
	cmd := exec.Command(adapterBin)
	if minimal {
		cmd.Env = append(os.Environ(), "IOP_TESTADAPTER_VARIANT=minimal")
	}
	rec := &logRecorder{}
	p, err := pluginhost.Start(t.Context(), pluginhost.Options{Cmd: cmd, Logger: slog.New(rec), Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p, rec
}

// eachHost runs f as a subtest on every host.
func eachHost(t *testing.T, f func(t *testing.T, start func(t *testing.T, minimal bool) (*pluginhost.Plugin, *logRecorder))) {
	for _, h := range hosts {
		t.Run(h.name, func(t *testing.T) { f(t, h.start) })
	}
}

// logRecorder is an slog.Handler that keeps every record.
type logRecorder struct {
	mu      sync.Mutex
	records []logRecord
	attrs   []slog.Attr
	parent  *logRecorder
}

type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]any
}

func (r *logRecorder) root() *logRecorder {
	if r.parent != nil {
		return r.parent.root()
	}
	return r
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	attrs := map[string]any{}
	for _, a := range r.attrs {
		attrs[a.Key] = a.Value.Any()
	}
	rec.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.Any()
		return true
	})
	root := r.root()
	root.mu.Lock()
	defer root.mu.Unlock()
	root.records = append(root.records, logRecord{rec.Level, rec.Message, attrs})
	return nil
}

func (r *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &logRecorder{attrs: append(append([]slog.Attr{}, r.attrs...), as...), parent: r}
}

func (r *logRecorder) WithGroup(string) slog.Handler { return r }

// all returns the records so far.
func (r *logRecorder) all() []logRecord {
	root := r.root()
	root.mu.Lock()
	defer root.mu.Unlock()
	return append([]logRecord(nil), root.records...)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
