package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/iop-dev/iop/internal/pluginpb"
	"google.golang.org/grpc"
)

// maxRequestSize bounds one message the adapter receives (a run request
// with its images): the largest a Node may be configured to take (noded's
// limits.max_request_mib, at most 1024), which the Node enforces before the
// request reaches the adapter.
const maxRequestSize = 1 << 30

// parentPollInterval is how often a serving adapter checks that the Node
// that started it is still there.
const parentPollInterval = time.Second

// Serve runs a as an adapter plugin and never returns. It is all an
// adapter's main needs:
//
//	func main() { sdk.Serve(myadapter.New()) }
//
// Run as `program describe`, it prints a's Info and capabilities as JSON to
// stdout (see Describe) and exits. Otherwise it speaks the plugin protocol
// to the Node that started it: go-plugin's handshake and protocol version,
// gRPC on a local socket with mutual TLS. A program started by hand says it
// is a plugin and exits 1.
//
// While serving:
//   - A panic in any adapter method fails that call with a KindInternal
//     error saying it panicked; the process keeps serving.
//   - The process exits when its parent (the Node) has gone.
//   - Nothing of the SDK writes to stdout (go-plugin's handshake owns it).
//     slog's default logger (and the log package) write hclog-style JSON
//     lines to stderr, which the Node reads into its own structured log;
//     IOP_ADAPTER_LOG_LEVEL (debug, info, warn, error) sets the level, info
//     by default.
func Serve(a Adapter) {
	if len(os.Args) == 2 && os.Args[1] == "describe" {
		if err := Describe(os.Stdout, a); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// go-plugin replaces os.Stderr with a stream to the host once it
	// serves; logs go to the real stderr, which the host reads line by line.
	stderr := os.Stderr
	log := newPluginLogger(stderr, os.Getenv("IOP_ADAPTER_LOG_LEVEL"))
	slog.SetDefault(log)
	go exitWithParent(os.Getppid(), parentPollInterval, log)

	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: plugin.HandshakeConfig{
			ProtocolVersion:  pluginpb.ProtocolVersion,
			MagicCookieKey:   pluginpb.MagicCookieKey,
			MagicCookieValue: pluginpb.MagicCookieValue,
		},
		Plugins: plugin.PluginSet{pluginpb.PluginName: &grpcPlugin{srv: newAdapterServer(a, log)}},
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts, serverOptions()...)...)
		},
		Logger: hclog.New(&hclog.LoggerOptions{
			Name: "go-plugin", Output: stderr, JSONFormat: true, Level: hclog.Info,
		}),
	})
	os.Exit(0)
}

// Describe writes a's description as one JSON object: name, version,
// description, config_fields, capabilities (derived from the interfaces a
// implements) and protocol_version. Serve prints it for `describe`; a host
// binary that embeds adapters (noded) calls it for its own describe command.
func Describe(w io.Writer, a Adapter) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("sdk: adapter panicked in Info: %v", r)
		}
	}()
	info := a.Info()
	out := struct {
		Name            string            `json:"name"`
		Version         string            `json:"version"`
		Description     string            `json:"description"`
		ConfigFields    map[string]string `json:"config_fields"`
		Capabilities    []string          `json:"capabilities"`
		ProtocolVersion int               `json:"protocol_version"`
	}{info.Name, info.Version, info.Description, info.ConfigFields, capabilities(a), pluginpb.ProtocolVersion}
	if out.ConfigFields == nil {
		out.ConfigFields = map[string]string{}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return fmt.Errorf("sdk: describe: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// ServeListener serves a's plugin protocol on l, without go-plugin's
// process handshake or TLS, until ctx is done or l fails; it returns nil
// when ctx ends it. Hosts use it to run an adapter in their own process over
// the same gRPC path as a plugin (the Node's built-in adapters in tests, and
// the conformance kit for an adapter value); adapter programs use Serve.
func ServeListener(ctx context.Context, a Adapter, l net.Listener) error {
	srv := grpc.NewServer(serverOptions()...)
	pluginpb.RegisterAdapterServer(srv, newAdapterServer(a, slog.Default()))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case <-ctx.Done():
		srv.Stop()
		<-errc
		return nil
	case err := <-errc:
		srv.Stop()
		return err
	}
}

// grpcPlugin is the adapter side of go-plugin's plugin: it registers the
// Adapter service on go-plugin's gRPC server.
type grpcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	srv *adapterServer
}

var _ plugin.GRPCPlugin = (*grpcPlugin)(nil)

func (p *grpcPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pluginpb.RegisterAdapterServer(s, p.srv)
	return nil
}

func (p *grpcPlugin) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, errors.New("sdk: the adapter side of the plugin has no client")
}

// exitWithParent exits the process once its parent has gone: a killed Node
// must not leave adapters behind. The parent's death re-parents the process,
// which changes its parent pid. (On Linux the host also asks the kernel to
// kill the plugin with it; this covers every platform.)
func exitWithParent(ppid int, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for range t.C {
		if os.Getppid() != ppid {
			log.Warn("parent process gone; exiting", "parent_pid", ppid)
			os.Exit(1)
		}
	}
}

// newPluginLogger returns a logger writing JSON lines with hclog's keys
// (@timestamp, @level, @message), which the host parses into its log.
func newPluginLogger(w io.Writer, level string) *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		lv = slog.LevelInfo
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level: lv,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.TimeKey:
				a.Key = "@timestamp"
			case slog.LevelKey:
				a.Key = "@level"
				if l, ok := a.Value.Any().(slog.Level); ok {
					a.Value = slog.StringValue(strings.ToLower(l.String()))
				}
			case slog.MessageKey:
				a.Key = "@message"
			}
			return a
		},
	}))
}

// grpcWindow is the fixed HTTP/2 flow-control window of the plugin
// connection, both ways. A fixed window turns off gRPC's bandwidth
// estimator, which otherwise sends a window update and a ping (and gets a
// ping back) for nearly every small message: three extra writes per token
// on a stream of tokens. 1 MiB per stream covers the largest frame.
const grpcWindow = 1 << 20

// serverOptions are the plugin side's gRPC server options.
func serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxRequestSize),
		grpc.InitialWindowSize(grpcWindow),
		grpc.InitialConnWindowSize(16 * grpcWindow),
	}
}
