package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/iop-dev/iop/internal/node/agent"
	"github.com/iop-dev/iop/internal/node/nodeconfig"
)

// The Node is two parts, the agent and its health endpoints, started in
// that order and stopped in reverse: a plain function reads better than a
// dependency graph for two. (The Edge's dozen parts, which edged/dev also
// extends, are wired with fx in internal/edge/app.)

// runFlags are the command-line flags of `noded run`.
type runFlags struct {
	configPath string
	healthAddr string
}

// startTimeout bounds starting the Node's parts.
const startTimeout = 15 * time.Second

// checkConfig loads and validates a configuration file.
func checkConfig(path string) error {
	_, err := nodeconfig.Load(path)
	return err
}

// runNode runs the Node until SIGINT or SIGTERM, then drains and stops.
// A second signal during the drain kills the process.
func runNode(flags runFlags) error {
	cfg, err := nodeconfig.Load(flags.configPath)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, cfg, flags.healthAddr, stop)
}

// run runs the Node of cfg until ctx ends; then it drains, within the
// configured drain timeout plus 10 s. healthAddr, if not empty, is where
// the health endpoints listen. stopped, if not nil, is called once ctx has
// ended (runNode's restores the default signal handling).
func run(ctx context.Context, cfg *nodeconfig.Config, healthAddr string, stopped func()) error {
	log := cfg.Log.NewLogger(os.Stderr).With("node", cfg.NodeID)
	a, err := agent.New(cfg, agent.Options{Version: version, Logger: log})
	if err != nil {
		return err
	}
	stopTimeout := time.Duration(cfg.DrainTimeout) + 10*time.Second
	stopAgent := func() error {
		sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		return a.Stop(sctx) // drains
	}

	sctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := a.Start(sctx); err != nil {
		return err
	}
	var health *http.Server
	if healthAddr != "" {
		if health, err = serveHealth(healthAddr, a, log); err != nil {
			return errors.Join(err, stopAgent())
		}
	}

	<-ctx.Done()
	if stopped != nil {
		stopped()
	}
	var errs []error
	if health != nil {
		hctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, health.Shutdown(hctx))
		cancel()
	}
	return errors.Join(append(errs, stopAgent())...)
}

// serveHealth serves the Node's health endpoints on addr.
func serveHealth(addr string, a *agent.Agent, log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health endpoints: %w", err)
	}
	// Probes are small and quick: nothing here may be held open.
	srv := &http.Server{Handler: a.HealthHandler(), ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	log.Info("health endpoints listening", "addr", ln.Addr().String())
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("health server failed", "err", err)
		}
	}()
	return srv, nil
}
