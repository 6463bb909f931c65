// Package agent is the Node daemon's core: it turns a Node configuration
// into a running connection to the Edge (TLS identity, lease key, providers,
// the transport client and the stream handler) with Start and Stop.
package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/iop-dev/iop/configs"
	"github.com/iop-dev/iop/noded/config"
	"github.com/iop-dev/iop/noded/leasekey"
	"github.com/iop-dev/iop/noded/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/pki"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Options are what the daemon adds to the configuration file.
type Options struct {
	Version string
	Logger  *slog.Logger
	// Liveness defaults to quicwire.DefaultLiveness: the daemons always
	// run the real profile.
	Liveness quicwire.Liveness
}

// Agent is a running Node.
type Agent struct {
	cfg    *config.Config
	log    *slog.Logger
	client *transport.Client
	key    *leasekey.Key

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// New prepares a Node from cfg: it loads the identity files and the lease
// key, so a bad file fails here, before anything starts.
func New(cfg *config.Config, opts Options) (*Agent, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Liveness == (quicwire.Liveness{}) {
		opts.Liveness = quicwire.DefaultLiveness
	}
	tlsConf, err := nodeTLS(cfg)
	if err != nil {
		return nil, err
	}
	key, err := leasekey.LoadOrCreate(cfg.LeaseKeyFile)
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: opts.Logger, key: key}
	a.client, err = transport.New(transport.Options{
		NodeID:         cfg.NodeID,
		Version:        opts.Version,
		EdgeAddr:       cfg.Edge.Address,
		TLS:            tlsConf,
		Liveness:       opts.Liveness,
		Backoff:        transport.Backoff{Initial: time.Duration(cfg.Reconnect.InitialBackoff), Max: time.Duration(cfg.Reconnect.MaxBackoff)},
		LeasePublicKey: key.Public[:],
		Labels:         cfg.Labels,
		Providers:      transport.StaticProviders(configuredProviders(cfg)),
		Handler:        &handler{agent: a},
		Logger:         opts.Logger,
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// nodeTLS builds the Node's TLS configuration for its identity mode.
func nodeTLS(cfg *config.Config) (*tls.Config, error) {
	id := cfg.Identity
	if id.Mode == configs.ModeLoopback {
		host, _, err := net.SplitHostPort(cfg.Edge.Address)
		if err != nil || !configs.IsLoopbackHost(host) {
			return nil, fmt.Errorf("loopback mode does not authenticate the Edge, so the Node may only dial a loopback address, not %q", cfg.Edge.Address)
		}
		return quicwire.LoopbackNodeTLSConfig(), nil
	}
	pool, cert, err := pki.LoadIdentity(id.CAFile, id.CertFile, id.KeyFile, quicwire.NodeIdentity(id.TrustDomain, cfg.NodeID))
	if err != nil {
		return nil, err
	}
	return quicwire.NodeTLSConfig(pool, cert, id.TrustDomain, id.EdgeID, nil), nil
}

// configuredProviders reports the configured providers. Adapters do not run
// in this version yet, so they are offline and have no capacity: the Edge
// sends them nothing.
func configuredProviders(cfg *config.Config) []*wirepb.Provider {
	var ps []*wirepb.Provider
	for _, p := range cfg.Providers {
		wp := &wirepb.Provider{
			Name:    p.Name,
			Adapter: p.Adapter,
			State:   wirepb.ProviderState_PROVIDER_STATE_OFFLINE,
			Detail:  "adapter runtime not available in this version",
		}
		for _, t := range p.Targets {
			wp.Targets = append(wp.Targets, &wirepb.Target{Name: t})
		}
		ps = append(ps, wp)
	}
	return ps
}

// Client is the transport client, for status.
func (a *Agent) Client() *transport.Client { return a.client }

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
	a.log.Info("node stopped")
	return err
}

// Ready reports nil when the Node's connection is registered and ready.
func (a *Agent) Ready() error {
	st := a.client.Status()
	if st.State == transport.StateReady {
		return nil
	}
	if st.LastError != nil {
		return fmt.Errorf("%s: %w", st.State, st.LastError)
	}
	return fmt.Errorf("%s", st.State)
}
