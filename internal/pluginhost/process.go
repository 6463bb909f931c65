package pluginhost

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"github.com/iop-dev/iop/internal/pluginpb"
	"google.golang.org/grpc"
)

// checkSHA256 refuses a binary whose SHA-256 is not want, before anything
// runs it.
func checkSHA256(path string, want []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("pluginhost: checksum of %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("pluginhost: checksum of %s: %w", path, err)
	}
	if got := h.Sum(nil); !bytes.Equal(got, want) {
		return fmt.Errorf("%w: %s has sha256 %s, configuration pins %s",
			ErrChecksumMismatch, path, hex.EncodeToString(got), hex.EncodeToString(want))
	}
	return nil
}

// procRunner is the go-plugin runner of one plugin process. go-plugin has
// its own, but this one lets the host see the exit (Exited, the status) and
// keeps the process's stdout past the handshake visible in the log.
type procRunner struct {
	cmd    *exec.Cmd
	stdout io.ReadCloser
	stderr io.ReadCloser
	log    *slog.Logger

	exited chan struct{} // closed when Wait has returned

	mu        sync.Mutex
	started   bool
	cancelled bool   // the host gave up starting: do not start, or kill
	stopping  bool   // the host is stopping the process: its exit is expected
	status    string // how the process ended, once exited is closed
}

var _ runner.Runner = (*procRunner)(nil)

// newProcRunner prepares cmd (not yet started); stdoutTrap receives
// whatever the process writes to its real stdout after the handshake line.
func newProcRunner(cmd *exec.Cmd, stdoutTrap io.Writer, log *slog.Logger) (*procRunner, error) {
	setParentDeathSignal(cmd)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	return &procRunner{
		cmd:    cmd,
		stdout: &afterFirstLine{r: stdout, tee: stdoutTrap},
		stderr: stderr,
		log:    log,
		exited: make(chan struct{}),
	}, nil
}

// setEnv gives the process cmd.Env (nil: the host's environment) followed
// by go-plugin's variables, which win.
func (r *procRunner) setEnv(pluginEnv []string) {
	env := r.cmd.Env
	if env == nil {
		env = os.Environ()
	}
	r.cmd.Env = append(env[:len(env):len(env)], pluginEnv...)
}

func (r *procRunner) Start(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancelled {
		return errStartCancelled
	}
	if err := r.cmd.Start(); err != nil {
		return err
	}
	r.started = true
	// A Node starts a plugin again whenever one stopped while idle is
	// needed (execution's idle stop): the starts and the exits the host
	// asked for are routine, and logged at debug level.
	r.log.Debug("plugin started", "path", r.cmd.Path, "pid", r.cmd.Process.Pid)
	return nil
}

// stop tells the runner that the host is ending the process, so that its
// exit is expected.
func (r *procRunner) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopping = true
}

var errStartCancelled = errors.New("start cancelled")

// cancelStart stops a start in progress: go-plugin's Start holds its lock
// until the handshake ends, so the host cannot Kill the client meanwhile;
// killing the process ends the handshake at once.
func (r *procRunner) cancelStart() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cancelled = true
	if r.started {
		_ = r.cmd.Process.Kill()
	}
}

// Wait is called once by go-plugin, after the process's stdout and stderr
// have reached EOF.
func (r *procRunner) Wait(context.Context) error {
	err := r.cmd.Wait()
	status := "exit status 0"
	if err != nil {
		status = err.Error()
	}
	r.mu.Lock()
	r.status = status
	expected := r.stopping || r.cancelled
	r.mu.Unlock()
	close(r.exited)
	level := slog.LevelInfo // the process ended by itself: a crash, or a bug
	if expected {
		level = slog.LevelDebug
	}
	r.log.Log(context.Background(), level, "plugin process exited", "pid", r.cmd.Process.Pid, "status", status)
	return err
}

func (r *procRunner) exitStatus() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

func (r *procRunner) Kill(context.Context) error {
	r.mu.Lock()
	started := r.started
	r.mu.Unlock()
	if !started {
		return nil
	}
	if err := r.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func (r *procRunner) Stdout() io.ReadCloser { return r.stdout }
func (r *procRunner) Stderr() io.ReadCloser { return r.stderr }
func (r *procRunner) Name() string          { return r.cmd.Path }

func (r *procRunner) ID() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.started {
		return ""
	}
	return strconv.Itoa(r.cmd.Process.Pid)
}

func (r *procRunner) Diagnose(context.Context) string {
	return fmt.Sprintf("is %s an IOP adapter built with sdk.Serve (plugin protocol %d) for this platform?",
		r.cmd.Path, pluginpb.ProtocolVersion)
}

func (r *procRunner) PluginToHost(network, addr string) (string, string, error) {
	return network, addr, nil
}

func (r *procRunner) HostToPlugin(network, addr string) (string, string, error) {
	return network, addr, nil
}

// afterFirstLine passes a plugin's stdout to go-plugin (which reads the
// handshake line from it and discards the rest) and copies everything after
// the first line to tee: an adapter must not write to stdout, and the log
// shows it when one does.
type afterFirstLine struct {
	r       io.ReadCloser
	tee     io.Writer
	pastOne bool
}

func (a *afterFirstLine) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	b := p[:n]
	if !a.pastOne {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return n, err
		}
		a.pastOne = true
		b = b[i+1:]
	}
	if len(b) > 0 {
		_, _ = a.tee.Write(b)
	}
	return n, err
}

func (a *afterFirstLine) Close() error { return a.r.Close() }

// hostPlugin is the host side of go-plugin's plugin: it hands out the
// Adapter service's gRPC client.
type hostPlugin struct {
	plugin.NetRPCUnsupportedPlugin
}

var _ plugin.GRPCPlugin = hostPlugin{}

func (hostPlugin) GRPCServer(*plugin.GRPCBroker, *grpc.Server) error {
	return errors.New("pluginhost: the host side of the plugin serves nothing")
}

func (hostPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, cc *grpc.ClientConn) (any, error) {
	return pluginpb.NewAdapterClient(cc), nil
}

// silentLogger is go-plugin's logger: level Off, so that go-plugin never
// parses plugin stderr lines (see logtrap.go). The host logs what matters
// (start, exit and status) itself.
func silentLogger() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Off, Output: io.Discard})
}

// startProcess starts o.Cmd as a go-plugin client and connects to it.
func startProcess(ctx context.Context, o Options, name string, log *slog.Logger) (*Plugin, error) {
	sink := newLogSink(log)
	stderrW := &lineWriter{sink: sink, stream: "stderr"}
	stdioErrW := &lineWriter{sink: sink, stream: "stderr"}
	stdoutW := &lineWriter{sink: sink, stream: "stdout"}
	proc, err := newProcRunner(o.Cmd, stdoutW, log)
	if err != nil {
		sink.close()
		return nil, fmt.Errorf("pluginhost: start %s: %w", name, err)
	}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  handshake,
		Plugins:          plugin.PluginSet{pluginpb.PluginName: hostPlugin{}},
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		Managed:          false,
		SkipHostEnv:      true, // newProcRunner applies Cmd.Env (or the host's environment) itself
		StartTimeout:     o.StartTimeout,
		GRPCDialOptions:  fixedWindows,
		Logger:           silentLogger(),
		Stderr:           stderrW,
		SyncStderr:       stdioErrW,
		SyncStdout:       stdoutW,
		RunnerFunc: func(_ hclog.Logger, spec *exec.Cmd, _ string) (runner.Runner, error) {
			proc.setEnv(spec.Env) // go-plugin's cookie, protocol versions, socket dir, client cert
			return proc, nil
		},
	})
	cleanup := func() {
		proc.stop()
		client.Kill()
		stderrW.flush()
		stdioErrW.flush()
		stdoutW.flush()
		sink.close()
	}

	// go-plugin's start does not take a context: run it aside and kill
	// the client if ctx ends first.
	type started struct {
		rpc pluginpb.AdapterClient
		err error
	}
	done := make(chan started, 1)
	go func() {
		rpc, err := dispense(client)
		done <- started{rpc, err}
	}()
	var s started
	select {
	case s = <-done:
	case <-ctx.Done():
		proc.cancelStart()
		<-done
		s.err = ctx.Err()
	}
	if s.err != nil {
		cleanup()
		return nil, fmt.Errorf("pluginhost: start %s: %w", name, s.err)
	}
	p := &Plugin{
		name:       name,
		rpc:        s.rpc,
		pid:        proc.cmd.Process.Pid,
		exited:     proc.exited,
		exitStatus: proc.exitStatus,
		stop:       cleanup,
		closing:    make(chan struct{}),
	}
	if err := p.describe(ctx); err != nil {
		cleanup()
		return nil, err
	}
	return p, nil
}

// dispense starts the client's process and returns its Adapter client.
func dispense(client *plugin.Client) (pluginpb.AdapterClient, error) {
	cp, err := client.Client()
	if err != nil {
		return nil, err
	}
	raw, err := cp.Dispense(pluginpb.PluginName)
	if err != nil {
		return nil, err
	}
	return raw.(pluginpb.AdapterClient), nil
}

// describeTimeout bounds the Describe call that ends a start.
const describeTimeout = 10 * time.Second
