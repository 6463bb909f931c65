// Package agent is the Node daemon's core: it turns a Node configuration
// into running connections to its Edges (TLS identity, lease key,
// providers, the transport cluster and the stream handlers) with Start and
// Stop.
package agent

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/internal/node/execution"
	"github.com/iop-dev/iop/internal/node/leasekey"
	"github.com/iop-dev/iop/internal/node/nodecert"
	"github.com/iop-dev/iop/internal/node/nodeconfig"
	"github.com/iop-dev/iop/internal/node/nodemetrics"
	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/plugins/builtin"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/lease"
	"github.com/iop-dev/iop/sdk"
)

// Options are what the daemon adds to the configuration file.
type Options struct {
	Version string
	Logger  *slog.Logger
	// Liveness defaults to quicwire.DefaultLiveness: the daemons always
	// run the real profile.
	Liveness quicwire.Liveness
	// Self is the command that serves a built-in adapter when NAME is
	// appended: by default this executable with "plugin" (`noded plugin
	// ollama`).
	Self []string
	// Supervision defaults to execution.DefaultSupervision.
	Supervision *execution.Supervision
}

// Agent is a running Node.
type Agent struct {
	cfg       *nodeconfig.Config
	log       *slog.Logger
	cluster   *edgeclient.Cluster
	key       *leasekey.Key
	providers *execution.Set
	metrics   *nodemetrics.Metrics

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// New prepares a Node from cfg: it loads the identity files and the lease
// key, so a bad file fails here, before anything starts.
func New(cfg *nodeconfig.Config, opts Options) (*Agent, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Liveness == (quicwire.Liveness{}) {
		opts.Liveness = quicwire.DefaultLiveness
	}
	dialTLS, certs, err := nodeTLS(cfg)
	if err != nil {
		return nil, err
	}
	key, err := leasekey.LoadOrCreate(cfg.LeaseKeyFile)
	if err != nil {
		return nil, err
	}
	if opts.Self == nil {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find own executable to start built-in adapters: %w", err)
		}
		opts.Self = []string{exe, "plugin"}
	}
	sup := execution.DefaultSupervision
	if opts.Supervision != nil {
		sup = *opts.Supervision
	}
	stall := execution.Liveness{CloseGrace: time.Duration(cfg.Stall.CloseGrace), ProbeTimeout: time.Duration(cfg.Stall.ProbeTimeout)}
	sup.ProbeTimeout = stall.ProbeTimeout
	a := &Agent{cfg: cfg, log: opts.Logger, key: key, providers: execution.NewSet()}
	a.metrics = nodemetrics.New(nodemetrics.Options{Providers: a.providerStates, Edges: func() []edgeclient.EdgeStatus { return a.cluster.Edges() }})
	for _, p := range cfg.Providers {
		launch, err := launcher(p, opts.Self, opts.Logger)
		if err != nil {
			return nil, err
		}
		conf, err := json.Marshal(p.Config)
		if err != nil {
			return nil, fmt.Errorf("providers %s: config: %w", p.Name, err)
		}
		a.providers.Add(execution.NewProvider(execution.ProviderConfig{
			Name: p.Name, Adapter: p.Adapter, Targets: p.Targets, Capacity: p.Capacity, Config: sdk.Config(conf), Launch: launch,
			RelistInterval: time.Duration(p.RelistInterval), // 0 (a config built in code) is the runtime's default
			IdleStop:       time.Duration(p.IdleStop),       // 0 keeps the plugin running (issue 25)
			MaxLoaded:      p.MaxLoadedModels,               // 0: not known (issue 23)
			Metrics:        a.metrics,
		}, sup, opts.Logger, a.providers.Notify))
	}
	var wake []execution.WakeTarget
	for _, w := range cfg.Wake {
		wake = append(wake, execution.WakeTarget{NodeID: w.NodeID, MAC: w.HardwareAddr(), Addr: w.Addr()})
	}
	waker := execution.NewWaker(wake, opts.Logger)
	a.cluster, err = edgeclient.NewCluster(edgeclient.ClusterOptions{
		Seeds: cfg.Edge.Seeds(),
		TLS:   dialTLS,
		Client: edgeclient.Options{
			NodeID:         cfg.NodeID,
			Version:        opts.Version,
			Liveness:       opts.Liveness,
			Backoff:        edgeclient.Backoff{Initial: time.Duration(cfg.Reconnect.InitialBackoff), Max: time.Duration(cfg.Reconnect.MaxBackoff)},
			LeasePublicKey: key.Public[:],
			Capacity:       cfg.TotalCapacity(),
			MaxRequest:     cfg.Limits.MaxRequest(),
			Labels:         cfg.Labels,
			WakeTargets:    execution.WakeTargetsWire(wake),
			Providers:      a.providers,
			Certificates:   certs,
		},
		// Each Edge signs its leases with its own key and sends its own
		// revocations: a lease opener per Edge connection (R11), sealed
		// to this Node's one X25519 key. The providers, and their slots,
		// are the Node's, shared by every Edge (issue 22).
		PerEdge: func(status func() edgeclient.Status) (edgeclient.Handler, edgeclient.Leases) {
			leases := lease.NewOpener(lease.OpenerConfig{Key: &key.Private, Public: &key.Public})
			return execution.NewHandler(a.providers, opts.Logger, execution.HandlerOptions{
				Status: status, Stall: stall, Leases: leases, Metrics: a.metrics, Waker: waker,
			}), leases
		},
		Logger: opts.Logger,
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// launcher returns how to start provider p's plugin: a built-in adapter by
// re-executing self, a third-party one from its binary, pinned by SHA-256.
func launcher(p nodeconfig.Provider, self []string, log *slog.Logger) (execution.Launcher, error) {
	var sum []byte
	if p.Adapter == nodeconfig.AdapterExternal {
		var err error
		if sum, err = hex.DecodeString(p.SHA256); err != nil {
			return nil, fmt.Errorf("providers %s: sha256: %w", p.Name, err)
		}
	} else if !builtin.Has(p.Adapter) {
		return nil, fmt.Errorf("providers %s: no built-in adapter %q", p.Name, p.Adapter)
	}
	log = log.With("provider", p.Name)
	return func(ctx context.Context) (execution.Plugin, error) {
		cmd := exec.Command(p.Binary)
		if p.Adapter != nodeconfig.AdapterExternal {
			cmd = exec.Command(self[0], append(slices.Clone(self[1:]), p.Adapter)...)
		}
		return pluginhost.Start(ctx, pluginhost.Options{Cmd: cmd, SHA256: sum, Logger: log})
	}, nil
}

// dialTLS is the TLS configuration that dials one Edge (edgeclient.
// ClusterOptions.TLS).
type dialTLS = func(addr, edgeID string) (*tls.Config, error)

// nodeTLS builds the Node's TLS configuration for each Edge it dials, for
// its identity mode, and in managed mode the certificate the transport
// renews (its TLS configuration presents the renewed one from the next
// connection on).
//
// Managed mode identifies an Edge by the edge identity its certificate
// names: at a seed address, any Edge of the trust domain, or only
// identity.edge_id when it is set; at an address learned from a cluster's
// list, only the Edge the list names there (an Edge the Node accepted
// vouches for the others). Loopback mode authenticates no Edge, so it dials only
// loopback addresses, listed ones included. Every Edge is sent
// edge.server_name, or its address's host, as its TLS server name.
func nodeTLS(cfg *nodeconfig.Config) (dialTLS, edgeclient.Certificates, error) {
	id := cfg.Identity
	serverName := func(addr string) string {
		if cfg.Edge.ServerName != "" {
			return cfg.Edge.ServerName
		}
		host, _, _ := net.SplitHostPort(addr)
		return host
	}
	if id.Mode == yamlconf.ModeLoopback {
		loopback := func(addr, _ string) (*tls.Config, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil || !yamlconf.IsLoopbackHost(host) {
				return nil, fmt.Errorf("loopback mode does not authenticate the Edge, so the Node may only dial a loopback address, not %q", addr)
			}
			c := quicwire.LoopbackNodeTLSConfig()
			c.ServerName = serverName(addr)
			return c, nil
		}
		for _, addr := range cfg.Edge.Seeds() {
			if _, err := loopback(addr, ""); err != nil {
				return nil, nil, err
			}
		}
		return loopback, nil, nil
	}
	certs, _, err := nodecert.Load(id.CAFile, id.CertFile, id.KeyFile, quicwire.NodeIdentity(id.TrustDomain, cfg.NodeID))
	if err != nil {
		return nil, nil, err
	}
	return func(addr, listedID string) (*tls.Config, error) {
		want := id.EdgeID
		if listedID != "" {
			want = listedID
		}
		c := certs.TLSConfig(id.TrustDomain, want)
		c.ServerName = serverName(addr)
		return c, nil
	}, certs, nil
}

// Providers are the Node's providers.
func (a *Agent) Providers() *execution.Set { return a.providers }

// Cluster is the Node's connections to its Edges, for status.
func (a *Agent) Cluster() *edgeclient.Cluster { return a.cluster }

// Metrics are the Node's metrics, which HealthHandler serves at /metrics.
func (a *Agent) Metrics() *nodemetrics.Metrics { return a.metrics }

// providerStates is what a scrape reads of the providers.
func (a *Agent) providerStates() []nodemetrics.ProviderState {
	ps := a.providers.Providers()
	out := make([]nodemetrics.ProviderState, 0, len(ps))
	for _, p := range ps {
		out = append(out, nodemetrics.ProviderState{Name: p.Name(), Online: p.Online(), InUse: p.InUse(),
			Capacity: p.Capacity(), Circuit: p.Circuit()})
	}
	return out
}

// Start connects to the Edge in the background; the connection is kept up
// (reconnecting with backoff) until Stop.
func (a *Agent) Start(context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cancel != nil {
		return errors.New("agent already started")
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel, a.done = cancel, make(chan struct{})
	a.providers.Start()
	go func() {
		defer close(a.done)
		a.cluster.Run(ctx)
	}()
	a.log.Info("node starting", "edges", a.cfg.Edge.Seeds(), "identity", a.cfg.Identity.Mode)
	return nil
}

// Stop drains: it tells the Edge, lets in-flight work finish for up to the
// configured drain timeout (or until ctx ends), then closes the connection
// with shutdown and stops reconnecting.
func (a *Agent) Stop(ctx context.Context) error {
	a.mu.Lock()
	cancel, done := a.cancel, a.done
	a.mu.Unlock()
	if cancel == nil {
		return nil
	}
	dctx, dcancel := context.WithTimeout(ctx, time.Duration(a.cfg.DrainTimeout))
	err := a.cluster.Drain(dctx, "node shutting down")
	dcancel()
	cancel()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	a.providers.Stop()
	a.log.Info("node stopped")
	return err
}

// Ready reports nil when the Node serves through at least one Edge: a
// connection registered and ready on an Edge that is not stopping. The
// others, unreachable or stopping, do not hold it back (issue 22);
// otherwise the error says where each connection is.
func (a *Agent) Ready() error {
	if a.cluster.Ready() {
		return nil
	}
	var why []string
	for _, e := range a.cluster.Edges() {
		s := fmt.Sprintf("%s: %s", e.Addr, e.State)
		switch {
		case e.Stopping:
			s += " (edge stopping)"
		case e.LastError != nil:
			s += ": " + e.LastError.Error()
		}
		why = append(why, s)
	}
	return errors.New(strings.Join(why, "; "))
}
