package execution

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// A provider whose adapter gives a tunnel route has nothing for its plugin
// to do on the byte path: the Node relays its raw tunnels itself
// (tunnel.go). Its plugin is needed only for the calls the adapter alone
// can answer: a normalized run, an embedding, a listing or a probe. With
// ProviderConfig.IdleStop set, such a plugin process is stopped once it has
// had no call for IdleStop ("parked"), and started again by the next call
// that needs it ("woken"); meanwhile the provider stays online with the
// capabilities, route and targets its last process gave, and its raw
// tunnels are relayed as before.
//
// Parking is not a crash: it is neither a restart in the metrics nor a
// failure for the circuit breaker. A woken plugin that exits by itself, or
// that fails to start, is one, and goes through Supervise's restart path as
// a resident plugin's would.
//
// Only the calls a client is waiting for (runs, embeddings, the plugin's
// own tunnels) hold the plugin for IdleStop after they end. The Node's own
// calls (a relisting every RelistInterval, a probe) wake a parked plugin
// and let it go as soon as they end, so that relisting does not keep an
// idle provider's process alive.

// idlePlugin is the Plugin a parking provider hands out: every call runs on
// a live process, started for it when none runs, and the process is
// stopped when it has been idle for the provider's IdleStop. It is safe
// for concurrent use.
type idlePlugin struct {
	prov *Provider
	idle time.Duration
	// ctx bounds the starts of woken plugins; Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	// dead is closed (Exited) when a woken plugin exited by itself or
	// failed to start: Supervise then restarts the provider.
	dead     chan struct{}
	deadOnce sync.Once
	// wg counts the wakes and parks in progress, which Close waits for.
	wg sync.WaitGroup

	mu       sync.Mutex
	live     Plugin  // nil while parked
	starting *waking // the wake in progress, if any
	inflight int     // calls using or waiting for the plugin
	lastUse  time.Time
	timer    *time.Timer
	closed   bool
}

// waking is one start of a parked plugin, which every call that needs the
// plugin meanwhile waits for.
type waking struct {
	done chan struct{}
	err  error // set before done is closed
}

var _ Plugin = (*idlePlugin)(nil)

// newIdlePlugin takes over pl, the provider's freshly started plugin, and
// parks it as soon as nothing uses it: the start that brought it up was the
// provider's own (its capabilities, route and targets), not a call's.
func newIdlePlugin(p *Provider, pl Plugin, idle time.Duration) *idlePlugin {
	h := &idlePlugin{prov: p, idle: idle, live: pl, dead: make(chan struct{})}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.watchExit(pl)
	h.mu.Lock()
	h.armLocked()
	h.mu.Unlock()
	return h
}

// use returns a live plugin for one call, waking a parked one, and the
// function that ends the call. client says whether a client waits for the
// call: only such calls hold the plugin for the idle period after them.
func (h *idlePlugin) use(ctx context.Context, client bool) (Plugin, func(), error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, nil, sdk.Errorf(sdk.KindUnavailable, "provider %s: the adapter plugin is stopped", h.prov.cfg.Name)
	}
	h.inflight++ // from here the plugin is not parked under the call
	for h.live == nil {
		if exited(h) {
			h.mu.Unlock()
			h.release(false)
			return nil, nil, sdk.Errorf(sdk.KindUnavailable, "provider %s: the adapter plugin exited; restarting", h.prov.cfg.Name)
		}
		w := h.starting
		if w == nil {
			w = &waking{done: make(chan struct{})}
			h.starting = w
			h.wg.Add(1)
			go h.wake(w)
		}
		h.mu.Unlock()
		select {
		case <-w.done:
		case <-ctx.Done():
			h.release(false)
			return nil, nil, ctx.Err()
		}
		if w.err != nil {
			h.release(false)
			return nil, nil, w.err
		}
		h.mu.Lock()
	}
	pl := h.live
	h.mu.Unlock()
	var once sync.Once
	return pl, func() { once.Do(func() { h.release(client) }) }, nil
}

// release ends one call; the last one out arms the idle timer.
func (h *idlePlugin) release(client bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.inflight--
	if client {
		h.lastUse = time.Now()
	}
	h.armLocked()
}

// armLocked sets the idle timer to the moment the plugin will have been
// idle for the idle period, when it runs and nothing uses it.
func (h *idlePlugin) armLocked() {
	if h.inflight > 0 || h.live == nil || h.closed {
		return
	}
	wait := max(0, time.Until(h.lastUse.Add(h.idle)))
	if h.timer == nil {
		h.timer = time.AfterFunc(wait, h.parkIfIdle)
		return
	}
	h.timer.Reset(wait)
}

// parkIfIdle stops the plugin process if it is still idle: no call in
// flight, and none for the idle period.
func (h *idlePlugin) parkIfIdle() {
	h.mu.Lock()
	if h.inflight > 0 || h.live == nil || h.closed {
		h.mu.Unlock()
		return
	}
	if wait := time.Until(h.lastUse.Add(h.idle)); wait > 0 {
		h.timer.Reset(wait) // a call came and went since the timer was set
		h.mu.Unlock()
		return
	}
	pl := h.live
	h.live = nil // its exit from now on is this park, not a crash
	h.wg.Add(1)
	h.mu.Unlock()
	defer h.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), h.prov.sup.StartTimeout)
	defer cancel()
	if err := pl.Close(ctx); err != nil {
		h.prov.log.Warn("stopping the idle adapter plugin", "err", err)
	}
	h.prov.log.Debug("adapter plugin stopped while idle; the Node relays its tunnels", "idle", h.idle)
}

// wake starts a plugin process for the calls waiting on w, configured and
// asked for its capabilities and route as at every start. A failed start
// is a failed plugin: the provider is restarted by Supervise.
func (h *idlePlugin) wake(w *waking) {
	defer h.wg.Done()
	began := time.Now()
	ctx, cancel := context.WithTimeout(h.ctx, h.prov.sup.StartTimeout)
	pl, caps, route, err := h.prov.launch(ctx)
	cancel()
	h.mu.Lock()
	h.starting = nil
	switch {
	case err == nil && h.closed:
		h.mu.Unlock()
		_ = pl.Close(context.Background())
		w.err = sdk.Errorf(sdk.KindUnavailable, "provider %s: the adapter plugin is stopped", h.prov.cfg.Name)
	case err != nil:
		h.mu.Unlock()
		w.err = sdk.Errorf(sdk.KindUnavailable, "provider %s: the adapter plugin did not start: %w", h.prov.cfg.Name, err)
		if h.ctx.Err() == nil {
			h.prov.log.Warn("adapter plugin failed to start for a call", "err", err)
			h.die()
		}
	default:
		h.live = pl
		h.watchExit(pl)
		h.armLocked() // for when every caller that waited has given up
		h.mu.Unlock()
		h.prov.woke(caps, route)
		h.prov.log.Debug("adapter plugin started for a call", "took", time.Since(began))
	}
	close(w.done)
}

// watchExit watches pl until it exits: an exit that is not a park (pl is
// still the live plugin) is a crash.
func (h *idlePlugin) watchExit(pl Plugin) {
	h.wg.Go(func() {
		select {
		case <-pl.Exited():
		case <-h.ctx.Done():
			return // Close stops it
		}
		h.mu.Lock()
		crashed := h.live == pl
		if crashed {
			h.live = nil
		}
		h.mu.Unlock()
		if crashed {
			_ = pl.Close(context.Background()) // a plugin is closed also after it exited
			h.die()
		}
	})
}

func (h *idlePlugin) die() { h.deadOnce.Do(func() { close(h.dead) }) }

// Exited is closed when a plugin process of the provider exited by itself
// or a woken one failed to start, not when an idle one was stopped.
func (h *idlePlugin) Exited() <-chan struct{} { return h.dead }

// Close stops the plugin process, if one runs, and waits for the wakes and
// parks in progress. Calls after it fail.
func (h *idlePlugin) Close(ctx context.Context) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	if h.timer != nil {
		h.timer.Stop()
	}
	pl := h.live
	h.live = nil
	h.mu.Unlock()
	h.cancel()
	var err error
	if pl != nil {
		err = pl.Close(ctx)
	}
	h.wg.Wait()
	return err
}

// Capabilities are the provider's, as its last plugin process reported.
func (h *idlePlugin) Capabilities() []string {
	h.prov.mu.Lock()
	defer h.prov.mu.Unlock()
	return h.prov.caps
}

func (h *idlePlugin) Configure(ctx context.Context, cfg sdk.Config) error {
	pl, done, err := h.use(ctx, true)
	if err != nil {
		return err
	}
	defer done()
	return pl.Configure(ctx, cfg)
}

func (h *idlePlugin) Execute(ctx context.Context, req *wirepb.RunRequest, cred *sdk.Credential, emit func(*wirepb.RunEvent) error) (*wirepb.RunEvent, error) {
	pl, done, err := h.use(ctx, true)
	if err != nil {
		return nil, err
	}
	defer done()
	return pl.Execute(ctx, req, cred, emit)
}

func (h *idlePlugin) Embed(ctx context.Context, req *wirepb.EmbedRequest, cred *sdk.Credential, emit func(*wirepb.EmbedVectors) error) (*wirepb.RunEvent, error) {
	pl, done, err := h.use(ctx, true)
	if err != nil {
		return nil, err
	}
	defer done()
	return pl.Embed(ctx, req, cred, emit)
}

func (h *idlePlugin) Tunnel(ctx context.Context, req *wirepb.TunnelRequest, cred *sdk.Credential, body io.Reader, emit func(*wirepb.TunnelFrame) error) error {
	pl, done, err := h.use(ctx, true)
	if err != nil {
		return err
	}
	defer done()
	return pl.Tunnel(ctx, req, cred, body, emit)
}

func (h *idlePlugin) TunnelRoute(ctx context.Context) (*sdk.TunnelRoute, error) {
	pl, done, err := h.use(ctx, false)
	if err != nil {
		return nil, err
	}
	defer done()
	return pl.TunnelRoute(ctx)
}

// ListTargets is the Node's own call (a relisting): it wakes a parked
// plugin and does not hold it.
func (h *idlePlugin) ListTargets(ctx context.Context) ([]sdk.Target, error) {
	pl, done, err := h.use(ctx, false)
	if err != nil {
		return nil, err
	}
	defer done()
	return pl.ListTargets(ctx)
}

// Probe is the Node's own call (after a stall, or recovering a target): it
// wakes a parked plugin and does not hold it.
func (h *idlePlugin) Probe(ctx context.Context, target string) (sdk.Health, error) {
	pl, done, err := h.use(ctx, false)
	if err != nil {
		return sdk.Health{}, err
	}
	defer done()
	return pl.Probe(ctx, target)
}
