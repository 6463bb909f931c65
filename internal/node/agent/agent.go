// Package agent is the Node daemon's core: it turns a Node configuration
// into a running connection to the Edge (TLS identity, lease key, providers,
// the transport client and the stream handler) with Start and Stop.
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
	client    *edgeclient.Client
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
	tlsConf, certs, err := nodeTLS(cfg)
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
	// The lease opener (R11): this Node's X25519 key; the Edge's signing
	// key arrives with each registration.
	leases := lease.NewOpener(lease.OpenerConfig{Key: &key.Private, Public: &key.Public})
	stall := execution.Liveness{CloseGrace: time.Duration(cfg.Stall.CloseGrace), ProbeTimeout: time.Duration(cfg.Stall.ProbeTimeout)}
	sup.ProbeTimeout = stall.ProbeTimeout
	a := &Agent{cfg: cfg, log: opts.Logger, key: key, providers: execution.NewSet()}
	a.metrics = nodemetrics.New(nodemetrics.Options{Providers: a.providerStates, Edge: func() edgeclient.Status { return a.client.Status() }})
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
			Metrics:        a.metrics,
		}, sup, opts.Logger, a.providers.Notify))
	}
	a.client, err = edgeclient.New(edgeclient.Options{
		NodeID:         cfg.NodeID,
		Version:        opts.Version,
		EdgeAddr:       cfg.Edge.Address,
		TLS:            tlsConf,
		Liveness:       opts.Liveness,
		Backoff:        edgeclient.Backoff{Initial: time.Duration(cfg.Reconnect.InitialBackoff), Max: time.Duration(cfg.Reconnect.MaxBackoff)},
		LeasePublicKey: key.Public[:],
		Capacity:       cfg.TotalCapacity(),
		MaxRequest:     cfg.Limits.MaxRequest(),
		Labels:         cfg.Labels,
		Providers:      a.providers,
		Leases:         leases,
		Certificates:   certs,
		Handler: execution.NewHandler(a.providers, opts.Logger, execution.HandlerOptions{
			Status:  func() edgeclient.Status { return a.client.Status() },
			Stall:   stall,
			Leases:  leases,
			Metrics: a.metrics,
		}),
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

// nodeTLS builds the Node's TLS configuration for its identity mode, and in
// managed mode the certificate the transport renews (its TLS configuration
// presents the renewed one from the next connection on).
func nodeTLS(cfg *nodeconfig.Config) (*tls.Config, edgeclient.Certificates, error) {
	id := cfg.Identity
	if id.Mode == yamlconf.ModeLoopback {
		host, _, err := net.SplitHostPort(cfg.Edge.Address)
		if err != nil || !yamlconf.IsLoopbackHost(host) {
			return nil, nil, fmt.Errorf("loopback mode does not authenticate the Edge, so the Node may only dial a loopback address, not %q", cfg.Edge.Address)
		}
		return quicwire.LoopbackNodeTLSConfig(), nil, nil
	}
	certs, _, err := nodecert.Load(id.CAFile, id.CertFile, id.KeyFile, quicwire.NodeIdentity(id.TrustDomain, cfg.NodeID))
	if err != nil {
		return nil, nil, err
	}
	return certs.TLSConfig(id.TrustDomain, id.EdgeID), certs, nil
}

// Providers are the Node's providers.
func (a *Agent) Providers() *execution.Set { return a.providers }

// Client is the transport client, for status.
func (a *Agent) Client() *edgeclient.Client { return a.client }

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
		a.client.Run(ctx)
	}()
	a.log.Info("node starting", "edge_addr", a.cfg.Edge.Address, "identity", a.cfg.Identity.Mode)
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
	err := a.client.Drain(dctx, "node shutting down")
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

// Ready reports nil when the Node's connection is registered and ready.
func (a *Agent) Ready() error {
	st := a.client.Status()
	if st.State == edgeclient.StateReady {
		return nil
	}
	if st.LastError != nil {
		return fmt.Errorf("%s: %w", st.State, st.LastError)
	}
	return fmt.Errorf("%s", st.State)
}
