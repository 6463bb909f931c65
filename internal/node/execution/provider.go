package execution

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/internal/node/nodemetrics"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// ProviderConfig is one provider: an adapter process with one
// configuration, its targets and its capacity.
type ProviderConfig struct {
	Name    string
	Adapter string
	// Targets are the models served; empty means ask the adapter
	// (list_targets) once it is up, and again every RelistInterval
	// (inventory.go).
	Targets  []string
	Capacity int
	Config   sdk.Config
	Launch   Launcher
	// RelistInterval is how often discovered targets are listed again; 0
	// means DefaultRelistInterval. Unused when Targets is set.
	RelistInterval time.Duration
	// Metrics records the provider's calls, stalls and plugin restarts;
	// nil records nothing.
	Metrics *nodemetrics.Metrics
	// IdleStop, when positive, stops the plugin process of a provider
	// whose adapter gives a tunnel route once it has had no call for that
	// long, and starts it again for the next call that needs it (idle.go).
	// Zero keeps the plugin running.
	IdleStop time.Duration
	// MaxLoaded is how many models the provider's server holds loaded at
	// once, for the Edge's warm-first routing (loaded.go); 0: not known.
	MaxLoaded int
}

// Supervision policy: restart with backoff; after BreakerThreshold failures
// in a row the circuit opens for BreakerCooldown, then one attempt is made
// (half-open). A plugin that ran for StableAfter counts as healthy again.
type Supervision struct {
	Backoff          edgeclient.Backoff
	BreakerThreshold int
	BreakerCooldown  time.Duration
	StableAfter      time.Duration
	// StartTimeout bounds launching and configuring one plugin.
	StartTimeout time.Duration
	// Recovery paces the probes of a target found unavailable after a
	// stall, until it answers again; ProbeTimeout bounds each (0 means
	// DefaultProbeTimeout).
	Recovery     edgeclient.Backoff
	ProbeTimeout time.Duration
	// ListTimeout bounds each listing of a provider's targets (0 means
	// DefaultListTimeout). Unlisted paces the listings of a provider whose
	// model server has not answered since its plugin started, capped at
	// the provider's relist interval (inventory.go).
	ListTimeout time.Duration
	Unlisted    edgeclient.Backoff
}

// DefaultSupervision is the daemon's policy.
var DefaultSupervision = Supervision{
	Backoff:          edgeclient.Backoff{Initial: 500 * time.Millisecond, Max: 30 * time.Second},
	BreakerThreshold: 5,
	BreakerCooldown:  5 * time.Minute,
	StableAfter:      time.Minute,
	StartTimeout:     30 * time.Second,
	Recovery:         edgeclient.Backoff{Initial: 2 * time.Second, Max: 30 * time.Second},
	ProbeTimeout:     DefaultProbeTimeout,
	ListTimeout:      DefaultListTimeout,
	Unlisted:         edgeclient.Backoff{Initial: time.Second, Max: DefaultRelistInterval},
}

// Errors of admission, before any adapter is called.
var (
	// ErrCapacityExhausted: every slot of the provider is busy.
	ErrCapacityExhausted = errors.New("capacity exhausted")
	// ErrProviderOffline: the provider is not online: its plugin is not
	// running, or its model server has not listed its models yet.
	ErrProviderOffline = errors.New("provider offline")
)

// Provider keeps one adapter plugin running and admits runs against its
// capacity. Its zero value is not usable; see NewProvider.
type Provider struct {
	cfg   ProviderConfig
	sup   Supervision
	log   *slog.Logger
	slots chan struct{}
	// changed is called (without locks held) after every state change.
	changed func()

	// relay is the Node's own HTTP client for raw tunnels to the server of
	// an adapter that gives a route: its connections stay warm across
	// plugin restarts. Immutable.
	relay *http.Client
	// metrics are the provider's instruments, resolved once; circuit is
	// its breaker's state (nodemetrics.CircuitClosed, ...), for scrapes.
	metrics *nodemetrics.Provider
	circuit atomic.Value
	// busy counts StreamBusy refusals (BusyRefusals).
	busy atomic.Int64
	// listings numbers the target listings as they start (listTargets).
	listings atomic.Uint64

	mu        sync.Mutex
	state     wirepb.ProviderState
	detail    string
	plugin    Plugin
	route     *sdk.TunnelRoute // the running plugin's; nil: tunnels go through the plugin
	targets   []string
	listed    uint64 // the listing whose list targets is (replaceTargets)
	caps      []string
	attempted chan struct{} // closed after the first start attempt ended
	once      sync.Once
	// unhealthy marks targets found unavailable (health.go); superCtx is
	// Supervise's context while it runs, which recovery probers live in.
	unhealthy  map[string]bool
	superCtx   context.Context
	recovering sync.WaitGroup
	// loaded is what the server holds loaded, as last read, and uses
	// counts the calls holding a slot, by target (loaded.go); loadedKick
	// asks refreshLoaded for a read. loadedFails is refreshLoaded's own.
	loaded      loadedList
	uses        map[string]int
	loadedKick  chan struct{}
	loadedFails listFailures
}

// NewProvider returns a provider in the starting state; Supervise runs it.
func NewProvider(cfg ProviderConfig, sup Supervision, log *slog.Logger, changed func()) *Provider {
	if cfg.Capacity <= 0 {
		cfg.Capacity = 1
	}
	p := &Provider{
		cfg:       cfg,
		sup:       sup,
		relay:     newRelayClient(cfg.Capacity),
		metrics:   cfg.Metrics.Provider(cfg.Name),
		log:       log.With("provider", cfg.Name, "adapter", cfg.Adapter),
		slots:     make(chan struct{}, cfg.Capacity),
		changed:   changed,
		state:     wirepb.ProviderState_PROVIDER_STATE_STARTING,
		targets:   slices.Clone(cfg.Targets),
		attempted: make(chan struct{}),
		uses:      make(map[string]int),
		// loadedKick holds one pending read: kicks meanwhile are that read.
		loadedKick: make(chan struct{}, 1),
	}
	p.circuit.Store(nodemetrics.CircuitClosed)
	return p
}

// Name is the provider's name.
func (p *Provider) Name() string { return p.cfg.Name }

// Wire is the provider as the Edge sees it.
func (p *Provider) Wire() *wirepb.Provider {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := &wirepb.Provider{
		Name:         p.cfg.Name,
		Adapter:      p.cfg.Adapter,
		Capacity:     uint32(p.cfg.Capacity),
		State:        p.state,
		Detail:       p.detail,
		Capabilities: slices.Clone(p.caps),
		InUse:        uint32(len(p.slots)),
	}
	p.wireLoadedLocked(w)
	for _, t := range p.targets {
		wt := &wirepb.Target{Name: t}
		if p.unhealthy[t] {
			wt.Health = TargetHealthUnavailable
		}
		w.Targets = append(w.Targets, wt)
	}
	return w
}

// Serves reports whether the provider offers target.
func (p *Provider) Serves(target string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.targets, target)
}

// Acquire admits one call for no particular model; see AcquireFor.
func (p *Provider) Acquire() (pl Plugin, release func(), err error) { return p.AcquireFor("") }

// AcquireFor admits one call (a run, a tunnel, an embedding) on target: it
// takes a capacity slot of an online provider without waiting (over
// capacity is refused at once). release gives the slot back. The call
// counts as in use on target's loaded model until then, and its end has
// the loaded list read again (loaded.go).
func (p *Provider) AcquireFor(target string) (pl Plugin, release func(), err error) {
	p.mu.Lock()
	pl, state, detail := p.plugin, p.state, p.detail
	p.mu.Unlock()
	if state != wirepb.ProviderState_PROVIDER_STATE_ONLINE || pl == nil {
		if detail == "" {
			detail = "starting"
		}
		return nil, nil, fmt.Errorf("provider %s: %w (%s)", p.cfg.Name, ErrProviderOffline, detail)
	}
	select {
	case <-pl.Exited():
		// Dead, and Supervise has not said so yet: do not send work to it.
		return nil, nil, fmt.Errorf("provider %s: %w (plugin exited; restarting)", p.cfg.Name, ErrProviderOffline)
	default:
	}
	// The slots are the Node's, shared by every Edge it is connected to
	// (issue 22): this is where two Edges cannot oversubscribe it.
	select {
	case p.slots <- struct{}{}:
	default:
		return nil, nil, fmt.Errorf("provider %s: %w: all %d slots busy", p.cfg.Name, ErrCapacityExhausted, p.cfg.Capacity)
	}
	p.mu.Lock()
	p.uses[target]++
	p.mu.Unlock()
	// Every Edge hears of the slots in use (Provider.in_use), a hint for
	// its scheduler.
	p.notify()
	var once sync.Once
	return pl, func() {
		once.Do(func() {
			p.mu.Lock()
			if p.uses[target]--; p.uses[target] <= 0 {
				delete(p.uses, target)
			}
			p.mu.Unlock()
			<-p.slots
			p.notify()
			p.kickLoaded() // the server's list moved: expiry, or a model loaded for it
		})
	}, nil
}

// Current returns the running plugin without taking a capacity slot, for
// read-only metadata calls.
func (p *Provider) Current() (Plugin, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != wirepb.ProviderState_PROVIDER_STATE_ONLINE || p.plugin == nil {
		return nil, fmt.Errorf("provider %s: %w", p.cfg.Name, ErrProviderOffline)
	}
	return p.plugin, nil
}

// InUse is the number of busy slots.
func (p *Provider) InUse() int { return len(p.slots) }

// BusyRefusals counts the calls refused with quicwire.StreamBusy because
// every slot was taken.
func (p *Provider) BusyRefusals() int64 { return p.busy.Load() }

// Online reports whether the provider is online: its plugin runs and its
// model server listed its targets.
func (p *Provider) Online() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state == wirepb.ProviderState_PROVIDER_STATE_ONLINE
}

// Capacity is the number of slots.
func (p *Provider) Capacity() int { return p.cfg.Capacity }

// Circuit is the state of the plugin's circuit breaker:
// nodemetrics.CircuitClosed, CircuitOpen (cooling down after
// Supervision.BreakerThreshold failures in a row) or CircuitHalfOpen (the
// one start attempt after the cooldown).
func (p *Provider) Circuit() string { return p.circuit.Load().(string) }

func (p *Provider) set(state wirepb.ProviderState, detail string, pl Plugin) {
	p.mu.Lock()
	p.state, p.detail, p.plugin = state, detail, pl
	p.mu.Unlock()
	p.notify()
	if state == wirepb.ProviderState_PROVIDER_STATE_ONLINE {
		p.kickLoaded() // a new plugin's route, perhaps to another server: read what it holds
	}
}

// Supervise keeps the plugin running until ctx is done, then stops it. A
// crash takes the provider offline (its in-flight runs fail with
// provider_unavailable, reported by the run path) and the plugin is
// restarted with backoff behind a circuit breaker. go-plugin restarts
// nothing and its clients cannot be reused, so every start is a new launch,
// configured again.
//
// A plugin that is up but whose model server did not list its targets is
// not a failed start: the provider is offline with that detail while the
// plugin keeps asking (watch), and comes online when the server answers.
func (p *Provider) Supervise(ctx context.Context) {
	p.mu.Lock()
	p.superCtx = ctx
	p.mu.Unlock()
	var refreshing sync.WaitGroup
	refreshing.Go(func() { p.refreshLoaded(ctx) })
	defer func() {
		p.mu.Lock()
		p.superCtx = nil // no recovery prober starts after this
		p.mu.Unlock()
		p.recovering.Wait()
		refreshing.Wait() // ctx is done: it returns
		p.relay.CloseIdleConnections()
	}()
	failures := 0
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			p.metrics.Restarted()
		}
		pl, listErr, err := p.start(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			failures++
			p.log.Warn("adapter plugin failed to start", "err", err, "failures", failures)
			p.set(wirepb.ProviderState_PROVIDER_STATE_OFFLINE, "plugin failed to start: "+err.Error(), nil)
			p.firstAttemptDone()
		} else {
			p.circuit.Store(nodemetrics.CircuitClosed) // up: a half-open trial passed
			began := time.Now()
			if listErr != nil {
				p.set(wirepb.ProviderState_PROVIDER_STATE_OFFLINE, unlistedDetail(listErr), pl)
			} else {
				p.set(wirepb.ProviderState_PROVIDER_STATE_ONLINE, "", pl)
				p.log.Info("adapter plugin online", "targets", p.Wire().GetTargets())
			}
			p.firstAttemptDone() // after the state: the ready handshake reports it
			if p.watch(ctx, pl, listErr) {
				p.set(wirepb.ProviderState_PROVIDER_STATE_OFFLINE, "node stopping", nil)
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				_ = pl.Close(cctx)
				cancel()
				return
			}
			if time.Since(began) >= p.sup.StableAfter {
				failures = 0
			}
			failures++
			p.log.Warn("adapter plugin exited; restarting", "failures", failures)
			p.set(wirepb.ProviderState_PROVIDER_STATE_OFFLINE, "plugin exited; restarting", nil)
			_ = pl.Close(context.WithoutCancel(ctx))
		}
		wait := p.sup.Backoff.Delay(failures - 1)
		if failures >= p.sup.BreakerThreshold {
			wait = p.sup.BreakerCooldown
			detail := fmt.Sprintf("circuit open after %d failures in a row; next attempt in %v", failures, wait)
			p.log.Error("adapter plugin keeps failing", "failures", failures, "cooldown", wait)
			p.set(wirepb.ProviderState_PROVIDER_STATE_OFFLINE, detail, nil)
			p.circuit.Store(nodemetrics.CircuitOpen)
			failures = p.sup.BreakerThreshold - 1 // half-open: one attempt decides
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		p.circuit.CompareAndSwap(nodemetrics.CircuitOpen, nodemetrics.CircuitHalfOpen)
	}
	p.set(wirepb.ProviderState_PROVIDER_STATE_OFFLINE, "node stopping", nil)
	p.firstAttemptDone()
}

// firstAttemptDone releases WaitReady once the first start attempt has
// ended and its state is set.
func (p *Provider) firstAttemptDone() { p.once.Do(func() { close(p.attempted) }) }

// start launches and configures one plugin, and learns its targets. err is
// a failed start; listErr, with a running plugin, says that the model
// server did not list the targets of a provider that discovers them (the
// provider then has none until it does).
func (p *Provider) start(ctx context.Context) (pl Plugin, listErr, err error) {
	sctx, cancel := context.WithTimeout(ctx, p.sup.StartTimeout)
	defer cancel()
	pl, caps, route, err := p.launch(sctx)
	if err != nil {
		return nil, nil, err
	}
	targets := slices.Clone(p.cfg.Targets)
	if p.discovers(caps) {
		targets, _, listErr = p.listTargets(sctx, pl)
	}
	p.mu.Lock()
	p.caps, p.targets, p.route = caps, targets, route
	p.mu.Unlock()
	if route != nil && p.cfg.IdleStop > 0 {
		// Its raw tunnels need no plugin: the process runs only for
		// the calls that do (idle.go).
		pl = newIdlePlugin(p, pl, p.cfg.IdleStop)
	}
	return pl, listErr, nil
}

// launch starts and configures one plugin process and asks it for its
// capabilities and tunnel route (nil: tunnels go through the plugin).
func (p *Provider) launch(ctx context.Context) (pl Plugin, caps []string, route *sdk.TunnelRoute, err error) {
	pl, err = p.cfg.Launch(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := pl.Configure(ctx, p.cfg.Config); err != nil {
		_ = pl.Close(context.WithoutCancel(ctx))
		return nil, nil, nil, fmt.Errorf("configure: %w", err)
	}
	caps = pl.Capabilities()
	if slices.Contains(caps, sdk.CapTunnelRoute) {
		// Without a route the plugin's own Tunnel still relays (slower).
		if route, err = pl.TunnelRoute(ctx); err != nil {
			p.log.Warn("adapter reports a tunnel route but gave none; raw tunnels go through the plugin", "err", err)
			route = nil
		}
	}
	return pl, caps, route, nil
}

// woke takes the capabilities and route of a plugin process started again
// after it was parked: the binary may have been replaced meanwhile, and
// the route is asked after every Configure. A change is reported.
func (p *Provider) woke(caps []string, route *sdk.TunnelRoute) {
	p.mu.Lock()
	changed := !slices.Equal(p.caps, caps)
	p.caps, p.route = caps, route
	p.mu.Unlock()
	p.kickLoaded() // the route is asked again after every Configure
	if changed {
		p.log.Info("adapter plugin reports other capabilities after a restart", "capabilities", caps)
		p.notify()
	}
}

// tunnelRoute is the running plugin's route, nil when tunnels go through
// the plugin.
func (p *Provider) tunnelRoute() *sdk.TunnelRoute {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.route
}

// newRelayClient is the client of the Node's own tunnel relay: bodies
// byte for byte (no transparent gzip), redirects left to the client, no
// overall timeout (the stall watchdog decides when a silent server has
// stalled), and up to capacity connections kept warm.
func newRelayClient(capacity int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DisableCompression = true
	t.MaxIdleConnsPerHost = max(capacity, 16)
	// Every tunnel in flight holds a connection with both buffers, also
	// through a long silent prefill: sized for a request head and an
	// answer's line, not for throughput (a larger read goes past the
	// buffer, and the request body is written through).
	t.ReadBufferSize, t.WriteBufferSize = 1<<10, 1<<10
	return &http.Client{
		// Plain-HTTP model servers (the usual case: on the Node's own host
		// or LAN) get relayTransport, which spends no goroutine per
		// connection (issue 25: a tunnel waiting through a silent prefill
		// costs its own goroutine only); https and proxied servers get t.
		Transport: newRelayTransport(t, t.MaxIdleConnsPerHost),
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}
