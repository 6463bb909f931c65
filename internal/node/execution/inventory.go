package execution

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// The inventory (P1): a provider whose configuration lists no targets, and
// whose adapter can list them (list_targets), learns them from its model
// server when its plugin starts and lists them again every relist
// interval while the plugin runs. A change replaces the provider's targets
// and calls its changed hook once, so the Node sends one
// ProviderStatusUpdate: a model added on the server is routable, and a
// removed one leaves the Edge's selection, within one interval. A listing
// that finds the same targets changes nothing and sends nothing.
//
// A provider whose server does not answer when its plugin starts is
// offline ("model server not answering: ...") with its plugin up, not a
// failed start, and comes online with its targets at the first listing
// that succeeds.

const (
	// DefaultRelistInterval is ProviderConfig.RelistInterval's default
	// (nodeconfig.DefaultRelistInterval is the file's, the same).
	DefaultRelistInterval = 30 * time.Second
	// DefaultListTimeout bounds one listing. A listing is a small metadata
	// call; a server that takes longer is treated as not answering.
	DefaultListTimeout = 10 * time.Second
	// relistLogEvery is how often a failing listing is logged again while
	// it keeps failing.
	relistLogEvery = 10 * time.Minute
)

// discovers reports whether the provider learns its targets from its model
// server rather than from its configuration.
func (p *Provider) discovers(caps []string) bool {
	return len(p.cfg.Targets) == 0 && slices.Contains(caps, sdk.CapListTargets)
}

func (p *Provider) relistInterval() time.Duration {
	if p.cfg.RelistInterval > 0 {
		return p.cfg.RelistInterval
	}
	return DefaultRelistInterval
}

func (s Supervision) listTimeout() time.Duration {
	if s.ListTimeout > 0 {
		return s.ListTimeout
	}
	return DefaultListTimeout
}

// unlistedDelay is the wait before listing attempt n of a provider whose
// server has not answered yet: Unlisted's backoff (a second at first when
// unset), never longer than interval.
func (s Supervision) unlistedDelay(n int, interval time.Duration) time.Duration {
	b := s.Unlisted
	if b.Initial <= 0 {
		b.Initial = time.Second
	}
	if b.Max <= 0 || b.Max > interval {
		b.Max = interval
	}
	return b.Delay(n)
}

// listTargets asks pl for its targets' names, in the server's order,
// without empty or repeated names. Each listing is numbered as it starts
// (listing): replaceTargets keeps a later listing's list over an earlier
// one's that finishes after it, as a periodic listing started before a
// model was pulled and answering after the management call's own.
func (p *Provider) listTargets(ctx context.Context, pl Plugin) (names []string, listing uint64, err error) {
	listing = p.listings.Add(1)
	lctx, cancel := context.WithTimeout(ctx, p.sup.listTimeout())
	defer cancel()
	ts, err := pl.ListTargets(lctx)
	if err != nil {
		return nil, listing, err
	}
	names = make([]string, 0, len(ts))
	for _, t := range ts {
		if t.Name != "" && !slices.Contains(names, t.Name) {
			names = append(names, t.Name)
		}
	}
	return names, listing, nil
}

// unlistedDetail is the state detail of a provider whose model server has
// not listed its targets since the plugin started.
func unlistedDetail(err error) string {
	if sdk.KindOf(err) == sdk.KindUnavailable || errors.Is(err, context.DeadlineExceeded) {
		return "model server not answering: " + err.Error()
	}
	return "model server did not list its models: " + err.Error()
}

// watch serves while pl runs: it returns true when ctx is done and false
// when the plugin exits. For a provider that discovers its targets it
// lists them meanwhile: every relist interval once the server has answered,
// and, while it has not (listErr is the failure at start), after a backoff
// from Supervision.Unlisted capped at the interval. A Node and its model
// server often start together (one boot, one compose file), and the server
// is up seconds later: the first retries come after a second or two, so
// such a provider is not offline for a whole interval, and the cap keeps a
// server that stays down from being asked more often than a listed one.
func (p *Provider) watch(ctx context.Context, pl Plugin, listErr error) bool {
	p.mu.Lock()
	discovers := p.discovers(p.caps)
	p.mu.Unlock()
	if !discovers {
		select {
		case <-ctx.Done():
			return true
		case <-pl.Exited():
			return false
		}
	}
	listed := listErr == nil
	var fails listFailures
	if !listed {
		fails.failed(p.log, "model server not answering; the provider is offline until it lists its models", listErr)
	}
	interval := p.relistInterval()
	for attempt := 0; ; attempt++ {
		wait := interval
		if !listed {
			wait = p.sup.unlistedDelay(attempt, interval)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return true
		case <-pl.Exited():
			t.Stop()
			return false
		case <-t.C:
		}
		names, listing, err := p.listTargets(ctx, pl)
		switch {
		case ctx.Err() != nil:
			return true
		case err != nil && exited(pl):
			return false // Supervise says so
		case err != nil && !listed:
			fails.failed(p.log, "model server still not answering; the provider stays offline", err)
		case err != nil:
			// The last list stands. A failed listing says nothing about any
			// one target, and taking every model out of selection for a blip
			// would turn it into an outage; a server that is really gone
			// fails its runs before the first byte (the Edge moves the work
			// on) and a silent one is judged by the stall watchdog with an
			// exact-target probe (R5, R6).
			fails.failed(p.log, "listing the model server's targets failed; keeping the last list", err)
		case !listed:
			listed = true
			p.mu.Lock()
			p.targets, p.state, p.detail = names, wirepb.ProviderState_PROVIDER_STATE_ONLINE, ""
			p.listed = max(p.listed, listing)
			p.mu.Unlock()
			p.log.Info("model server answers; provider online", "targets", names, "after_failures", fails.n)
			fails = listFailures{}
			p.notify()
			p.kickLoaded()
		default:
			fails.recovered(p.log)
			p.replaceTargets(names, listing)
		}
	}
}

// replaceTargets takes names, the list of listing, as the provider's
// targets when they differ, as a set, from the current ones, and reports
// the change once. The list of a listing started before the one whose
// list stands is dropped: it may predate a change the later one saw.
func (p *Provider) replaceTargets(names []string, listing uint64) {
	p.mu.Lock()
	if listing < p.listed {
		p.mu.Unlock()
		return
	}
	p.listed = listing
	old := p.targets
	if sameSet(old, names) {
		p.mu.Unlock()
		return
	}
	p.targets = names
	p.mu.Unlock()
	var added, removed []string
	for _, n := range names {
		if !slices.Contains(old, n) {
			added = append(added, n)
		}
	}
	for _, n := range old {
		if !slices.Contains(names, n) {
			removed = append(removed, n)
		}
	}
	p.log.Info("model server's targets changed", "added", added, "removed", removed)
	p.notify()
	p.kickLoaded() // a removed model is unloaded too
}

func (p *Provider) notify() {
	if p.changed != nil {
		p.changed()
	}
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

func exited(pl Plugin) bool {
	select {
	case <-pl.Exited():
		return true
	default:
		return false
	}
}

// listFailures keeps a model server that stays down from writing a log
// line every interval: the first failure of a run of them is logged, then
// one line per relistLogEvery with the count so far, and one line when the
// server lists again.
type listFailures struct {
	n      int
	logged time.Time
}

func (f *listFailures) failed(log *slog.Logger, msg string, err error) {
	f.n++
	if f.n > 1 && time.Since(f.logged) < relistLogEvery {
		return
	}
	f.logged = time.Now()
	log.Warn(msg, "err", err, "failures", f.n)
}

func (f *listFailures) recovered(log *slog.Logger) {
	if f.n > 0 {
		log.Info("model server lists its targets again", "after_failures", f.n)
	}
	f.n = 0
}

// relistNow lists the targets of a provider that discovers them at once,
// outside its interval: a management call (issue 23: a pull, delete, copy
// or create through the Edge) has just changed what its model server
// holds, and the Edge should route by the new list now, not within an
// interval. A listing that fails keeps the last list, as a periodic one
// does. It runs beside the periodic listing; should one of those have
// started before it and finish after it, its older list is dropped
// (replaceTargets).
func (p *Provider) relistNow(ctx context.Context) {
	p.mu.Lock()
	pl, discovers := p.plugin, p.discovers(p.caps) && p.state == wirepb.ProviderState_PROVIDER_STATE_ONLINE
	p.mu.Unlock()
	if !discovers || pl == nil {
		return
	}
	names, listing, err := p.listTargets(ctx, pl)
	if err != nil {
		p.log.Warn("listing the model server's targets after a management call failed; keeping the last list", "err", err)
		return
	}
	p.replaceTargets(names, listing)
}
