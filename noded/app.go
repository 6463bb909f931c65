package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"go.uber.org/dig"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"

	"github.com/iop-dev/iop/internal/node/agent"
	"github.com/iop-dev/iop/internal/node/nodeconfig"
)

// runFlags are the command-line flags of `noded run`.
type runFlags struct {
	configPath string
	healthAddr string
}

// checkConfig loads and validates a configuration file.
func checkConfig(path string) error {
	_, err := nodeconfig.Load(path)
	return err
}

// runNode runs the Node until SIGINT or SIGTERM, then drains and stops.
func runNode(flags runFlags) error {
	cfg, err := nodeconfig.Load(flags.configPath)
	if err != nil {
		return err
	}
	stopTimeout := time.Duration(cfg.DrainTimeout) + 10*time.Second
	app := fx.New(nodeModule(cfg, flags), fx.StopTimeout(stopTimeout))
	if err := app.Err(); err != nil {
		return dig.RootCause(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), app.StartTimeout())
	defer cancel()
	if err := app.Start(ctx); err != nil {
		return dig.RootCause(err)
	}
	<-app.Wait() // SIGINT or SIGTERM
	ctx, cancel = context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	return app.Stop(ctx) // drains
}

// nodeModule is the Node's dependency graph; fx only appears in this file.
func nodeModule(cfg *nodeconfig.Config, flags runFlags) fx.Option {
	return fx.Options(
		fx.Supply(cfg, flags),
		fx.Provide(newLogger, newAgent),
		fx.WithLogger(func(log *slog.Logger) fxevent.Logger {
			l := &fxevent.SlogLogger{Logger: log}
			// fx's own events are debugging detail; a failed start is
			// reported once, by the caller, with its root cause.
			l.UseLogLevel(slog.LevelDebug)
			l.UseErrorLevel(slog.LevelDebug)
			return l
		}),
		fx.Invoke(startAgent, startHealth),
	)
}

func newLogger(cfg *nodeconfig.Config) *slog.Logger {
	return cfg.Log.NewLogger(os.Stderr).With("node", cfg.NodeID)
}

func newAgent(cfg *nodeconfig.Config, log *slog.Logger) (*agent.Agent, error) {
	return agent.New(cfg, agent.Options{Version: version, Logger: log})
}

func startAgent(lc fx.Lifecycle, a *agent.Agent) {
	lc.Append(fx.Hook{OnStart: a.Start, OnStop: a.Stop})
}

// startHealth serves the Node's health endpoints when --health-addr is set.
func startHealth(lc fx.Lifecycle, flags runFlags, a *agent.Agent, log *slog.Logger) {
	if flags.healthAddr == "" {
		return
	}
	// Probes are small and quick: nothing here may be held open.
	srv := &http.Server{Handler: a.HealthHandler(), ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			ln, err := net.Listen("tcp", flags.healthAddr)
			if err != nil {
				return err
			}
			log.Info("health endpoints listening", "addr", ln.Addr().String())
			go func() {
				if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
					log.Error("health server failed", "err", err)
				}
			}()
			return nil
		},
		OnStop: srv.Shutdown,
	})
}
