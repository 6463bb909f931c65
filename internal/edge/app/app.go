// Package app is the Edge's wiring: the only package of the Edge that
// imports fx. `edged run` and the all-in-one dev command (edged/dev) build
// the same graph from it.
package app

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/dig"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"

	"github.com/iop-dev/iop/internal/edge/adminapi"
	"github.com/iop-dev/iop/internal/edge/anthropicapi"
	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/cluster"
	"github.com/iop-dev/iop/internal/edge/credentials"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/ollamaapi"
	"github.com/iop-dev/iop/internal/edge/openaiapi"
	"github.com/iop-dev/iop/internal/edge/registrar"
	"github.com/iop-dev/iop/internal/edge/reload"
	"github.com/iop-dev/iop/internal/edge/resetkey"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/internal/edge/served"
	"github.com/iop-dev/iop/internal/edge/statuspage"
	"github.com/iop-dev/iop/internal/edge/wake"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire"
)

// StopTimeout bounds a stop: draining Nodes' work and closing listeners.
const StopTimeout = 30 * time.Second

// Run runs the Edge of cfg, with extra options (ScaledLiveness), until
// SIGINT or SIGTERM.
func Run(cfg *edgeconfig.Config, extra ...fx.Option) error {
	// Caught from before the start: fx listens for signals only once every
	// start hook has run, so a SIGTERM that came just after the Edge said
	// it serves would otherwise kill it without a stop.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(stop)
	a, err := Start(cfg, extra...)
	if err != nil {
		return err
	}
	select {
	case <-stop:
	case <-a.Wait():
	}
	// A planned stop drains first (drain.go); a second signal cuts it short.
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Grace())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	a.Drain(ctx)
	return a.Stop()
}

// Edge is a started Edge.
type Edge struct {
	fx    *fx.App
	http  *HTTPServer
	quic  *quic.Listener
	front *frontend.Front
	runs  *inflight.Tracker
	nodes *nodeserver.Server
	clust cluster.Membership
	log   *slog.Logger
}

// Start builds the Edge of cfg, with extra options (the dev command adds
// its Node), and starts it. A failed start is returned with its root
// cause, not fx's whole chain.
func Start(cfg *edgeconfig.Config, extra ...fx.Option) (*Edge, error) {
	e := &Edge{}
	opts := append([]fx.Option{Module(cfg), fx.StopTimeout(StopTimeout), fx.Populate(&e.http, &e.quic, &e.front, &e.runs, &e.nodes, &e.clust, &e.log)}, extra...)
	e.fx = fx.New(opts...)
	if err := e.fx.Err(); err != nil {
		return nil, dig.RootCause(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.fx.StartTimeout())
	defer cancel()
	if err := e.fx.Start(ctx); err != nil {
		return nil, dig.RootCause(err)
	}
	return e, nil
}

// HTTPAddr is the address the client API listens on, once started.
func (e *Edge) HTTPAddr() net.Addr { return e.http.bound }

// QUICAddr is the address Nodes dial.
func (e *Edge) QUICAddr() net.Addr { return e.quic.Addr() }

// Wait is closed at SIGINT or SIGTERM.
func (e *Edge) Wait() <-chan fx.ShutdownSignal { return e.fx.Wait() }

// Stop stops the Edge, within StopTimeout.
func (e *Edge) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), StopTimeout)
	defer cancel()
	return e.fx.Stop(ctx)
}

// Module is the Edge's dependency graph.
func Module(cfg *edgeconfig.Config) fx.Option {
	return fx.Options(
		fx.Supply(cfg, quicwire.DefaultLiveness, ConfigPath("")),
		fx.Provide(newLogger, newClusterDB, newMembership, newRegistry, newEdgeTLS, newQUICListener, newCredentials, newLeases, newTransport, newScheduler, newMetrics,
			newRefusals, newDoor, newAuthenticator, newLive, newServed, newWake, newDispatcher, newFront, newReloader, newClientCerts, newHTTPServer),
		fx.WithLogger(func(log *slog.Logger) fxevent.Logger {
			l := &fxevent.SlogLogger{Logger: log}
			// fx's own events are debugging detail; a failed start is
			// reported once, by the caller, with its root cause.
			l.UseLogLevel(slog.LevelDebug)
			l.UseErrorLevel(slog.LevelDebug)
			return l
		}),
		// Before the listeners: the admin socket is up once the Edge says
		// it serves.
		enrollment,
		fx.Invoke(serveTransport, runScheduler, serveHTTP, reloadOnSIGHUP),
	)
}

// ConfigPath is the configuration file the Edge was started from, which a
// reload reads again; "" when the configuration was built in code.
type ConfigPath string

// ConfigFile names the file cfg was loaded from, so that SIGHUP and POST
// /admin/v1/reload can read it again. Without it a reload is refused.
func ConfigFile(path string) fx.Option {
	return fx.Replace(ConfigPath(path))
}

// ScaledLiveness divides the Edge's liveness profile (R8: a 30 s heartbeat
// interval and a 45 s response wait) by div, for tests of the real daemon
// over real sockets, which cannot wait a minute for a fence: `edged run`
// has it as a hidden flag. Never for production.
func ScaledLiveness(div int) fx.Option {
	return fx.Replace(quicwire.DefaultLiveness.Scaled(div))
}

func newLogger(cfg *edgeconfig.Config) *slog.Logger {
	return cfg.Log.NewLogger(os.Stderr).With("edge", cfg.EdgeID)
}

// newRegistry numbers generations from the start time in Unix
// milliseconds, so they increase across Edge restarts too.
func newRegistry() *fleet.Registry {
	return fleet.New(fleet.Options{GenerationBase: uint64(time.Now().UnixMilli())})
}

// newRefusals counts what the Edge turns away and logs it without letting
// a flood flood the log.
func newRefusals(log *slog.Logger, m *edgemetrics.Metrics) *frontdoor.Refusals {
	return frontdoor.NewRefusals(log, m.Refusals)
}

// newDoor is the client listener's front door: the limits section (P3).
func newDoor(cfg *edgeconfig.Config, refused *frontdoor.Refusals) *frontdoor.Door {
	return frontdoor.New(frontdoor.Limits{
		MaxConns:            cfg.Limits.MaxConnections,
		MaxConnsPerSource:   cfg.Limits.ConnectionsPerSource(),
		BodyMemory:          int64(cfg.Limits.BodyMemoryMiB) << 20,
		PrincipalBodyMemory: cfg.Limits.PrincipalBodyMemory(),
		MaxRequest:          cfg.Limits.MaxRequest(),
		MinBodyRate:         cfg.Limits.MinBodyRate(),
	}, refused)
}

// newEdgeTLS builds the TLS configuration of the Node-facing listener.
func newEdgeTLS(cfg *edgeconfig.Config, log *slog.Logger, refused *frontdoor.Refusals, enrolled *registrar.Service) (*tls.Config, error) {
	id := cfg.Identity
	if id.Mode == yamlconf.ModeLoopback {
		host, _, err := net.SplitHostPort(cfg.Listen.QUIC)
		if err != nil || !yamlconf.IsLoopbackHost(host) {
			return nil, fmt.Errorf("loopback mode accepts unauthenticated Nodes, so it may only listen on a loopback address, not %q", cfg.Listen.QUIC)
		}
		log.Warn("identity mode is loopback: Nodes are not authenticated; use mtls for anything beyond one machine")
		return quicwire.LoopbackEdgeTLSConfig()
	}
	return managedEdgeTLS(cfg, log, refused, enrolled)
}

// newQUICListener binds the Node-facing QUIC listener at construction, so
// a taken port fails the start and the bound address is known. Its
// transport has the Edge's stateless reset key (see internal/edge/resetkey), so
// that after a restart Nodes learn at once that their connections are gone.
func newQUICListener(lc fx.Lifecycle, cfg *edgeconfig.Config, liveness quicwire.Liveness, tlsConf *tls.Config, log *slog.Logger) (*quic.Listener, error) {
	var identityKey crypto.PrivateKey
	if cfg.Identity.Mode == yamlconf.ModeMTLS && len(tlsConf.Certificates) > 0 {
		identityKey = tlsConf.Certificates[0].PrivateKey
	}
	if cfg.DataDir != "" {
		if err := prepareDataDir(cfg.DataDir); err != nil { // enroll.go
			return nil, err
		}
	}
	key, source, err := resetkey.Load(cfg.DataDir, identityKey)
	if err != nil {
		return nil, err
	}
	addr, err := net.ResolveUDPAddr("udp", cfg.Listen.QUIC)
	if err != nil {
		return nil, fmt.Errorf("listen.quic %s: %w", cfg.Listen.QUIC, err)
	}
	udp, err := net.ListenUDP("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen.quic %s: %w", cfg.Listen.QUIC, err)
	}
	tr := transport.EdgeTransport(transport.UnreachableIsLoss(udp), key)
	ln, err := tr.Listen(tlsConf, transport.EdgeQUICConfig(liveness))
	if err != nil {
		tr.Close()
		udp.Close()
		return nil, fmt.Errorf("listen.quic %s: %w", cfg.Listen.QUIC, err)
	}
	log.Info("quic stateless reset key", "source", string(source))
	lc.Append(fx.StopHook(func() error {
		err := ln.Close()
		tr.Close()
		udp.Close()
		return err
	}))
	return ln, nil
}

// newCredentials loads every configured credential from its source (an
// environment variable or a file); a missing one fails the start.
func newCredentials(cfg *edgeconfig.Config) (*credentials.Store, error) {
	return credentials.New(cfg, credentials.Options{})
}

// newLeases makes the lease issuer with a signing key of this process:
// leases are short-lived and bound to one Node generation, and Nodes learn
// the key at every registration, so it need not outlive the process.
func newLeases(store *credentials.Store) (*dispatch.Leases, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("lease signing key: %w", err)
	}
	return dispatch.NewLeases(store, key), nil
}

func newTransport(cfg *edgeconfig.Config, liveness quicwire.Liveness, reg *fleet.Registry, store *credentials.Store, leases *dispatch.Leases,
	refused *frontdoor.Refusals, enrolled *registrar.Service, cl cluster.Membership, log *slog.Logger) *nodeserver.Server {
	var e nodeserver.Enrollment
	if enrolled != nil { // a nil *Service in the interface would not be nil
		e = enrolled
	}
	return nodeserver.NewServer(nodeserver.Options{
		Enrollment:      e,
		EdgeID:          cfg.EdgeID,
		Liveness:        liveness,
		Managed:         cfg.Identity.Mode == yamlconf.ModeMTLS,
		TrustDomain:     cfg.Identity.TrustDomain,
		LeaseSigningKey: leases.PublicKey(),
		Credentials:     store,
		Refused:         refused,
		Directory:       directory(cl),
		Logger:          log,
	}, reg)
}

// serveTransport accepts Nodes from start to stop; stopping closes every
// Node connection with shutdown.
func serveTransport(lc fx.Lifecycle, srv *nodeserver.Server, ln *quic.Listener, log *slog.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			log.Info("accepting nodes", "quic", ln.Addr().String())
			go func() {
				defer close(done)
				if err := srv.Serve(ctx, ln); err != nil {
					log.Error("node transport stopped", "err", err)
				}
			}()
			return nil
		},
		OnStop: func(stop context.Context) error {
			err := srv.Shutdown(stop)
			cancel()
			ln.Close()
			<-done
			return err
		},
	})
}

func newScheduler(reg *fleet.Registry) *sched.Scheduler { return sched.New(reg, sched.Options{}) }

// runScheduler re-evaluates queued work on every registry change (R9).
func runScheduler(lc fx.Lifecycle, s *sched.Scheduler) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			go func() { defer close(done); s.Run(ctx) }()
			return nil
		},
		OnStop: func(context.Context) error { cancel(); <-done; return nil },
	})
}

// newMetrics labels every series with the Edge's id in a cluster (several
// Edges scraped into one Prometheus stay apart), and adds the cluster's
// figures.
func newMetrics(cfg *edgeconfig.Config, reg *fleet.Registry, s *sched.Scheduler, m cluster.Membership) *edgemetrics.Metrics {
	opts := edgemetrics.Options{Cluster: m}
	if cfg.Cluster.Enabled() {
		opts.EdgeID = cfg.EdgeID
	}
	return edgemetrics.NewWith(reg, s.Depths, opts)
}

// newLive is the tracker of the work in flight, for the status page.
// newLive tracks the work in flight, and records each piece's usage into
// the ledger as it ends.
func newLive(m cluster.Membership) *inflight.Tracker {
	return inflight.New(inflight.Options{Usage: m})
}

// newAuthenticator reports refused Ollama key signatures on a Refusals of
// their own, as Boundary's, so that their rate of logs is theirs alone.
func newAuthenticator(cfg *edgeconfig.Config, m *edgemetrics.Metrics, log *slog.Logger) (*auth.Authenticator, error) {
	a, err := auth.New(cfg, auth.WithRefusals(frontdoor.NewRefusals(log, m.Refusals).Refuse))
	if err != nil {
		return nil, err
	}
	ollamaKeys := slices.ContainsFunc(cfg.Principals, func(p edgeconfig.Principal) bool { return len(p.OllamaKeys) > 0 })
	if len(cfg.API.Keys) == 0 && !cfg.AnonymousAllowed() && len(cfg.API.TrustedNetworks) == 0 && !ollamaKeys {
		log.Warn("no API keys are configured and anonymous access is off: every client request will be refused (add api.keys)")
	}
	return a, nil
}

// newReloader applies a changed configuration file to the authenticator
// (the snapshot requests read), the credentials and the dispatcher.
func newReloader(cfg *edgeconfig.Config, path ConfigPath, authn *auth.Authenticator, store *credentials.Store, d *dispatch.Dispatcher,
	m *edgemetrics.Metrics, cl cluster.Membership, enrolled *registrar.Service, log *slog.Logger) *reload.Reloader {
	return reload.New(cfg, reload.Options{Path: string(path), Auth: authn, Credentials: store, Dispatcher: publishing{d, cl, enrolled, log}, Logger: log,
		Count: func(result string) { m.ConfigReloads.WithLabelValues(result).Inc() }})
}

// reloadOnSIGHUP reloads the configuration file at every SIGHUP, from
// start to stop. Without a file SIGHUP is left alone.
func reloadOnSIGHUP(lc fx.Lifecycle, r *reload.Reloader, path ConfigPath) {
	if path == "" {
		return
	}
	sig := make(chan os.Signal, 1)
	done := make(chan struct{})
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			signal.Notify(sig, syscall.SIGHUP)
			go func() {
				defer close(done)
				for range sig {
					_, _ = r.Reload("SIGHUP") // logged and counted by Reload
				}
			}()
			return nil
		},
		OnStop: func(context.Context) error {
			signal.Stop(sig)
			close(sig)
			<-done
			return nil
		},
	})
}

// newClientCerts reads api.tls's certificate and key, which the client
// listener serves and re-reads when they change; nil when api.tls is not
// set (plain HTTP).
func newClientCerts(cfg *edgeconfig.Config, log *slog.Logger) (*frontdoor.CertFiles, error) {
	if !cfg.API.TLS.Enabled() {
		return nil, nil
	}
	return frontdoor.NewCertFiles(cfg.API.TLS.CertFile, cfg.API.TLS.KeyFile, frontdoor.CertOptions{Logger: log})
}

// newServed is the Edge's memory of the models its Nodes served, kept in
// data_dir (without one, a start-up grace), kept up to date with the
// registry from start to stop (issue 26).
func newServed(lc fx.Lifecycle, cfg *edgeconfig.Config, liveness quicwire.Liveness, reg *fleet.Registry, log *slog.Logger) *served.Memory {
	path := ""
	if cfg.DataDir != "" {
		path = filepath.Join(cfg.DataDir, served.FileName)
	} else if p, err := served.CachePath(cfg.EdgeID, cfg.Listen.QUIC); err != nil {
		log.Warn("no data_dir and no usable cache directory for the models the Edge serves: after a restart, for a minute, every model no Node offers yet is answered 503 retry",
			"err", err, "fix", "set data_dir")
	} else {
		path = p
	}
	m := served.Open(served.Options{Path: path, Window: served.WindowFor(liveness), Logger: log})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			go func() { defer close(done); m.Run(ctx, reg) }()
			return nil
		},
		OnStop: func(context.Context) error { cancel(); <-done; return nil },
	})
	return m
}

// newWake is wake on demand (issue 23): which Nodes sleep, which models
// they served and who can wake them, kept in data_dir (wake.json) when
// there is one, kept up to date with the registry from start to stop.
func newWake(lc fx.Lifecycle, cfg *edgeconfig.Config, reg *fleet.Registry, srv *nodeserver.Server, m *edgemetrics.Metrics, log *slog.Logger) *wake.Tracker {
	path := ""
	if cfg.DataDir != "" {
		path = filepath.Join(cfg.DataDir, wake.FileName)
	}
	t := wake.New(wake.Options{Source: reg, Commands: srv, Path: path, Logger: log, Metrics: wake.NewMetrics(m.Registry())})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			go func() { defer close(done); t.Run(ctx) }()
			return nil
		},
		OnStop: func(context.Context) error { cancel(); <-done; return nil },
	})
	return t
}

func newDispatcher(cfg *edgeconfig.Config, s *sched.Scheduler, srv *nodeserver.Server, m *edgemetrics.Metrics, leases *dispatch.Leases,
	mem *served.Memory, wakes *wake.Tracker, log *slog.Logger) *dispatch.Dispatcher {
	opts := dispatch.Options{Metrics: m, Leases: leases, Logger: log, Served: mem}
	if wakes != nil {
		opts.Waker = wakes
	}
	return dispatch.New(cfg, dispatch.SchedulerSlots(s), dispatch.ServerNodes(srv), opts)
}

// newFront is the one front end every client API is a translation on.
func newFront(d *dispatch.Dispatcher, authn *auth.Authenticator, door *frontdoor.Door, m *edgemetrics.Metrics, runs *inflight.Tracker,
	log *slog.Logger) *frontend.Front {
	return frontend.New(frontend.FromDispatcher(d), authn, frontend.Options{Door: door, Metrics: m, Logger: log, Live: runs})
}

// HTTPServer is the Edge's HTTP listener and whether it is serving.
// NewHTTPServer builds it; serveHTTP binds it at start.
type HTTPServer struct {
	srv     *http.Server
	door    *frontdoor.Door
	certs   *frontdoor.CertFiles // nil: plain HTTP
	addr    string
	serving atomic.Bool
	// stopping: the Edge drains; /readyz says so (drain.go).
	stopping atomic.Bool
	bound    net.Addr
}

// newHTTPServer mounts everything the Edge serves over HTTP on one
// listener: the client APIs, the admin and health endpoints, the metrics,
// the status page. The admin reads and /metrics follow api.admin_reads;
// the status page holds no data (its data are the admin reads), so it is
// served to anyone.
//
// The whole listener is behind auth.Boundary, so no handler can forget it:
// a request let in without a key (trusted network, anonymous, open admin
// reads) must name the Edge by address, localhost or api.allowed_hosts,
// must not come from another site's page unless api.allowed_origins lists
// it, and must declare a JSON body. What reveals nothing is left open to
// anyone: health, readiness, the status page's files and the Ollama
// root's "Ollama is running" (so that the ollama CLI's probe passes and
// its next request shows the Edge's reason).
func newHTTPServer(cfg *edgeconfig.Config, reg *fleet.Registry, s *sched.Scheduler, m *edgemetrics.Metrics, door *frontdoor.Door,
	d *dispatch.Dispatcher, front *frontend.Front, authn *auth.Authenticator, store *credentials.Store, runs *inflight.Tracker, reloader *reload.Reloader,
	certs *frontdoor.CertFiles, cl cluster.Membership, wakes *wake.Tracker, log *slog.Logger) *HTTPServer {
	h := &HTTPServer{addr: cfg.Listen.HTTP, door: door, certs: certs}
	access := adminapi.Options{Authenticator: authn, Logger: log, ReadsOpen: authn.AdminReadsOpen, Reloader: reloader,
		Credentials: store, Queues: func() any { return s.Snapshot() },
		Models: func() any { return s.Models() }, Sessions: func() any { return d.Sessions() }, NotYetBack: func() any { return d.NotYetBack() }, Load: s.InFlight, Runs: runs, Cluster: cl}
	if wakes != nil {
		access.Wake = func() any { return wakes.Snapshot() }
	}
	admin := adminapi.Handler(reg, func() error {
		if h.stopping.Load() {
			return errors.New("stopping: this Edge takes no new work")
		}
		if !h.serving.Load() {
			return errors.New("starting")
		}
		return nil
	}, access)
	mux := http.NewServeMux()
	mux.Handle("/admin/", admin)
	mux.Handle("/healthz", admin)
	mux.Handle("/readyz", admin)
	mux.Handle("GET /metrics", adminapi.ReadAccess(m.Handler(), access))
	page := statuspage.Handler()
	mux.Handle(statuspage.Path, page)
	mux.Handle(statuspage.Path+"/", page)
	openai := openaiapi.Handler(front)
	mux.Handle("/v1/", openai)
	// Anthropic's Messages API; its clients list models at OpenAI's path,
	// told apart by their anthropic-version header.
	anthropic := anthropicapi.Handler(front)
	mux.Handle("/v1/messages", anthropic)
	mux.Handle("/v1/messages/", anthropic)
	mux.Handle("/v1/models", anthropicapi.ModelsOr(anthropic, openai))
	mux.Handle("/v1/models/", anthropicapi.ModelsOr(anthropic, openai))
	// Ollama's API, and its root: the ollama CLI probes HEAD / first.
	// Model management (pull, delete, copy, create) for admin principals.
	ollama := ollamaapi.Handler(front, ollamaapi.WithManagement(ollamaapi.Management{Auth: authn, Manager: d, Metrics: m}))
	mux.Handle("/api/", ollama)
	mux.Handle("/{$}", ollama)
	guarded := authn.Boundary(mux, auth.BoundaryOptions{
		Public: []string{"GET /healthz", "GET /readyz", "GET /{$}", "GET " + statuspage.Path, "GET " + statuspage.Path + "/"},
		Reads:  []string{"GET /admin/", "GET /metrics"},
		// Counted into the same iop_edge_refusals_total; its kinds are its own, so
		// a log of its own rate-limits nothing of the door's.
		Refuse: frontdoor.NewRefusals(log, m.Refusals).Refuse,
	})
	h.srv = door.Server(guarded, log)
	if certs != nil {
		h.srv.TLSConfig = certs.TLSConfig()
	}
	return h
}

// serveHTTP serves the client listener from start to stop: HTTPS (HTTP/2
// and HTTP/1.1) when api.tls is set, plain HTTP otherwise.
func serveHTTP(lc fx.Lifecycle, h *HTTPServer, authn *auth.Authenticator, log *slog.Logger) {
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			ln, err := h.door.Listen(h.addr)
			if err != nil {
				return fmt.Errorf("listen.http %s: %w", h.addr, err)
			}
			h.bound = ln.Addr()
			h.serving.Store(true)
			lim := h.door.Limits()
			scheme, serve := "http", func() error { return h.srv.Serve(ln) }
			if h.certs != nil {
				// ServeTLS adds HTTP/2 and answers a plain HTTP request
				// with 400 "Client sent an HTTP request to an HTTPS server".
				scheme, serve = "https", func() error { return h.srv.ServeTLS(ln, "", "") }
			}
			log.Info("serving "+scheme, "addr", ln.Addr().String(), "max_connections", lim.MaxConns,
				"body_memory_mib", lim.BodyMemory>>20, "admin_reads_open", authn.AdminReadsOpen())
			go func() {
				if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
					log.Error("http server failed", "err", err)
				}
			}()
			return nil
		},
		OnStop: func(ctx context.Context) error {
			h.serving.Store(false)
			err := h.srv.Shutdown(ctx)
			// Shutdown does not know the connections of detached
			// answers (frontdoor.Door.Detach): their last bytes go too.
			return errors.Join(err, h.door.WaitDetached(ctx))
		},
	})
}
