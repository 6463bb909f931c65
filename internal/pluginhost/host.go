// Package pluginhost starts and talks to adapter plugins: the host side of
// the plugin protocol that sdk.Serve speaks. The Node uses it to run each
// provider's adapter; sdk/sdktest uses it to check adapters.
//
// A Plugin is one adapter process (Start) or one adapter value in the host's
// own process (StartInProcess), behind the same API and the same gRPC path.
// The execution types cross the boundary unchanged: Execute hands the
// plugin's RunEvents to the caller as they arrive, and Tunnel its
// TunnelFrames. Errors come back as *sdk.Error, so errors.Is with the sdk
// sentinels works on the host. The conformance kit, which drives a plugin
// with sdk values, converts them with the functions of convert.go
// (RequestToWire, EventFromWire, ResultOf, ...), which hold every
// conversion of this side.
//
// A Plugin is never restarted: when its process exits (Exited), the owner
// calls Close and starts a new one (go-plugin clients cannot be reused).
//
// This package imports no QUIC, wiring or CLI library; only go-plugin, gRPC
// and the wire's generated types.
package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-plugin"
	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/sdk"
	"google.golang.org/grpc"
)

// handshake is go-plugin's handshake configuration for IOP adapters. An
// adapter built with sdk.Serve uses the same values (internal/pluginpb); a
// host and a plugin with different protocol versions refuse each other at
// start.
var handshake = plugin.HandshakeConfig{
	ProtocolVersion:  pluginpb.ProtocolVersion,
	MagicCookieKey:   pluginpb.MagicCookieKey,
	MagicCookieValue: pluginpb.MagicCookieValue,
}

var (
	// ErrPluginExited is matched by the error of a call the plugin process
	// did not answer because it exited. The same error also matches
	// sdk.ErrUnavailable.
	ErrPluginExited = errors.New("plugin process exited")
	// ErrClosed is matched by the error of a call on a closed Plugin (it
	// also matches sdk.ErrUnavailable).
	ErrClosed = errors.New("plugin closed")
	// ErrProtocol is matched by the error of a call whose answer broke the
	// plugin protocol (a run without a terminal, or with two; frames out of
	// order). It also matches sdk.ErrInternal.
	ErrProtocol = errors.New("plugin protocol violation")
	// ErrChecksumMismatch is matched by Start's error when the binary's
	// SHA-256 is not the pinned one.
	ErrChecksumMismatch = errors.New("plugin binary checksum mismatch")
)

// defaultStartTimeout is how long Start waits for a plugin's handshake
// when Options.StartTimeout is 0.
const defaultStartTimeout = 10 * time.Second

// closeTimeout bounds the adapter's Close call within Plugin.Close.
const closeTimeout = 5 * time.Second

// exitConfirmWait is how long a call that lost its connection waits for the
// process exit to be confirmed, so that it can say the plugin exited.
const exitConfirmWait = 2 * time.Second

// Options says how to start a plugin process.
type Options struct {
	// Cmd starts the plugin; it must not have been started. Its Env (nil:
	// the host's environment) is extended with go-plugin's variables. On
	// Linux the host sets SysProcAttr.Pdeathsig to SIGKILL, so a killed
	// Node takes its plugins with it. Stdout and Stderr must be nil: the
	// host reads both.
	//
	// A shipped adapter compiled into the Node is started by re-executing
	// the Node: exec.Command(os.Args[0], "plugin", name), where that
	// sub-command calls sdk.Serve.
	Cmd *exec.Cmd
	// SHA256, if set, pins the binary at Cmd.Path: a mismatch refuses the
	// plugin before it runs, with an error naming the file and both hashes.
	SHA256 []byte
	// Logger receives the plugin's log lines (its stderr, parsed
	// leniently; anything it writes to stdout) and the host's own messages
	// about it, all with the attribute plugin=Name. Nil: slog.Default().
	Logger *slog.Logger
	// Name labels the plugin in logs and errors. Empty: the base name of
	// Cmd.Path.
	Name string
	// StartTimeout bounds the handshake. Zero: 10 seconds.
	StartTimeout time.Duration
}

// Plugin is one started adapter. Its methods are safe for concurrent use.
type Plugin struct {
	name       string
	rpc        pluginpb.AdapterClient
	info       sdk.Info
	caps       []string
	pid        int
	exited     <-chan struct{}
	exitStatus func() string // how the process ended, once exited is closed
	stop       func()        // ends the process (or server) and waits for it

	closing   chan struct{} // closed when Close begins
	closeOnce sync.Once
	closeErr  error
}

// Start starts the plugin process o.Cmd, checks the handshake, connects to
// it with mutual TLS and asks it to describe itself. The caller owns the
// Plugin and must Close it, also after it has exited.
func Start(ctx context.Context, o Options) (*Plugin, error) {
	if o.Cmd == nil {
		return nil, errors.New("pluginhost: Options.Cmd is nil")
	}
	if o.Cmd.Process != nil {
		return nil, errors.New("pluginhost: Options.Cmd was already started")
	}
	if o.Cmd.Stdout != nil || o.Cmd.Stderr != nil {
		return nil, errors.New("pluginhost: Options.Cmd must not set Stdout or Stderr")
	}
	name := o.Name
	if name == "" {
		name = filepath.Base(o.Cmd.Path)
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = defaultStartTimeout
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("plugin", name)
	if o.SHA256 != nil {
		if err := checkSHA256(o.Cmd.Path, o.SHA256); err != nil {
			return nil, err
		}
	}
	return startProcess(ctx, o, name, log)
}

// describe asks the plugin for its info and capabilities.
func (p *Plugin) describe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, describeTimeout)
	defer cancel()
	d, err := p.rpc.Describe(ctx, &pluginpb.DescribeRequest{})
	if err != nil {
		return fmt.Errorf("pluginhost: describe %s: %w", p.name, p.callErr(ctx, err))
	}
	p.info = infoFromWire(d)
	p.caps = d.GetCapabilities()
	return nil
}

// Info returns the adapter's Info, as it described itself at start.
func (p *Plugin) Info() sdk.Info { return p.info }

// Capabilities returns the capabilities the adapter implements (sdk.Cap*).
func (p *Plugin) Capabilities() []string { return slices.Clone(p.caps) }

// has reports whether the adapter implements capability (an sdk.Cap* name).
func (p *Plugin) has(capability string) bool { return slices.Contains(p.caps, capability) }

// Pid returns the plugin's process id, or 0 for an in-process plugin.
func (p *Plugin) Pid() int { return p.pid }

// Exited is closed once the plugin's process has exited, for whatever
// reason (for an in-process plugin: once Close has stopped it).
func (p *Plugin) Exited() <-chan struct{} { return p.exited }

// Close calls the adapter's Close (if it implements it, bounded by ctx and
// a few seconds), then stops the process and waits for it. Calls made
// after Close began fail with ErrClosed. Close is idempotent: later calls
// wait for the first and return its result.
func (p *Plugin) Close(ctx context.Context) error {
	p.closeOnce.Do(func() {
		close(p.closing)
		if p.has(sdk.CapClose) && !p.hasExited() {
			ctx, cancel := context.WithTimeout(ctx, closeTimeout)
			resp, err := p.rpc.Close(ctx, &pluginpb.CloseRequest{})
			cancel()
			switch {
			case err != nil:
				p.closeErr = fmt.Errorf("pluginhost: close %s: %w", p.name, err)
			case resp.GetFailure() != nil:
				p.closeErr = errorFromFailure(resp.GetFailure())
			}
		}
		p.stop()
	})
	return p.closeErr
}

func (p *Plugin) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// fixedWindows are the host side's gRPC dial options: fixed flow-control
// windows, matching the plugin side (sdk.Serve), so gRPC's bandwidth
// estimator does not add a window update and a ping round trip to nearly
// every event.
var fixedWindows = []grpc.DialOption{
	grpc.WithInitialWindowSize(1 << 20),
	grpc.WithInitialConnWindowSize(16 << 20),
}
