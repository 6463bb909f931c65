package execution

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// modelServer is what a fake plugin's ListTargets reports: the server's
// models, or an error while it is down.
type modelServer struct {
	mu     sync.Mutex
	models []string
	down   error
}

func (s *modelServer) serve(models ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.models, s.down = models, nil
}

func (s *modelServer) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = err
}

func (s *modelServer) list(context.Context) ([]sdk.Target, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down != nil {
		return nil, s.down
	}
	out := make([]sdk.Target, len(s.models))
	for i, m := range s.models {
		out[i] = sdk.Target{Name: m}
	}
	return out, nil
}

var errRefused = &sdk.Error{Kind: sdk.KindUnavailable, Message: "dial tcp 127.0.0.1:11434: connect: connection refused"}

// inventoried is a provider under test: its plugins list srv's models.
type inventoried struct {
	prov     *Provider
	changes  atomic.Int32 // calls of the provider's changed hook
	launches atomic.Int32
	mu       sync.Mutex
	plugin   *fakePlugin // the latest launch
}

// startInventoried starts, in a set of its own, a provider configured with
// targets (none: discovered) that re-lists every interval, whose plugins
// list srv's models; it returns once the first start attempt has run. The
// set stops at the end of the test.
func startInventoried(t *testing.T, srv *modelServer, targets []string, interval time.Duration, log *slog.Logger) (*Set, *inventoried) {
	set := NewSet()
	inv := &inventoried{}
	cfg := ProviderConfig{Name: "p", Adapter: "ollama", Targets: targets, Capacity: 1, RelistInterval: interval,
		Launch: func(context.Context) (Plugin, error) {
			inv.launches.Add(1)
			pl := newFakePlugin(idle)
			pl.caps, pl.list = []string{sdk.CapListTargets, sdk.CapProbe}, srv.list
			inv.mu.Lock()
			inv.plugin = pl
			inv.mu.Unlock()
			return pl, nil
		}}
	inv.prov = NewProvider(cfg, DefaultSupervision, log, func() { inv.changes.Add(1); set.Notify() })
	set.Add(inv.prov)
	set.Start()
	t.Cleanup(set.Stop)
	synctest.Wait()
	return set, inv
}

func (inv *inventoried) current() *fakePlugin {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return inv.plugin
}

func wireTargets(p *Provider) []string {
	var out []string
	for _, t := range p.Wire().GetTargets() {
		out = append(out, t.GetName())
	}
	return out
}

func wantState(t *testing.T, p *Provider, state wirepb.ProviderState, targets ...string) {
	t.Helper()
	w := p.Wire()
	if got := wireTargets(p); w.GetState() != state || !slices.Equal(got, targets) {
		t.Fatalf("provider %v with targets %q (%q), want %v with %q", w.GetState(), got, w.GetDetail(), state, targets)
	}
}

// P1: a provider that discovers its targets lists them again every
// interval. A model added on the server is served, and a removed one is
// not, one interval after the change at the latest; each change reaches
// the Node's change notification exactly once, and a listing that finds
// the same models (in any order) reports nothing.
func TestRelistPicksUpAddedAndRemovedTargetsWithinOneInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const every = 10 * time.Second
		srv := &modelServer{}
		srv.serve("a")
		set, inv := startInventoried(t, srv, nil, every, discard())
		wantState(t, inv.prov, wirepb.ProviderState_PROVIDER_STATE_ONLINE, "a")
		base := inv.changes.Load()

		// Just after a listing: the worst case, a whole interval.
		changed := set.Changed()
		srv.serve("a", "b")
		time.Sleep(every - time.Millisecond)
		synctest.Wait()
		wantState(t, inv.prov, wirepb.ProviderState_PROVIDER_STATE_ONLINE, "a")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		wantState(t, inv.prov, wirepb.ProviderState_PROVIDER_STATE_ONLINE, "a", "b")
		if p, err := set.Lookup("", "", "b"); err != nil || p != inv.prov {
			t.Errorf("Lookup of the added target: %v, %v", p, err)
		}
		select {
		case <-changed:
		default:
			t.Fatal("the Node was not told about the added target")
		}
		if n := inv.changes.Load() - base; n != 1 {
			t.Fatalf("%d change notifications for one added target, want 1", n)
		}

		srv.serve("b", "a") // the same models, listed in another order
		time.Sleep(3 * every)
		synctest.Wait()
		if n := inv.changes.Load() - base; n != 1 {
			t.Fatalf("%d change notifications after listings that found no change, want still 1", n)
		}

		srv.serve("b")
		time.Sleep(every)
		synctest.Wait()
		wantState(t, inv.prov, wirepb.ProviderState_PROVIDER_STATE_ONLINE, "b")
		if _, err := set.Lookup("", "", "a"); err == nil {
			t.Error("the removed target is still looked up")
		}
		if n := inv.changes.Load() - base; n != 2 {
			t.Fatalf("%d change notifications after one addition and one removal, want 2", n)
		}
		if n := inv.current().lists.Load(); n != 1+5 {
			t.Errorf("%d listings in 5 intervals after the first, want 6", n)
		}
		if n := inv.launches.Load(); n != 1 {
			t.Errorf("%d launches: re-listing restarted the plugin", n)
		}
	})
}

// P1, R1: a provider whose model server does not answer when the Node
// starts is an offline provider with a clear detail, not a failed plugin:
// the plugin stays up (no restart, no circuit breaker), the ready handshake
// is not held back, and the provider comes online with its targets, once,
// when the server answers.
func TestModelServerDownAtStartIsAnOfflineProviderThatComesOnline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const every = 30 * time.Second
		srv := &modelServer{}
		srv.fail(errRefused)
		set, inv := startInventoried(t, srv, nil, every, discard())
		ready := make(chan error, 1)
		go func() { ready <- set.WaitReady(t.Context()) }()
		synctest.Wait()
		select {
		case err := <-ready:
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal("the ready handshake waits for a provider whose model server is down")
		}
		wantState(t, inv.prov, wirepb.ProviderState_PROVIDER_STATE_OFFLINE)
		if d := inv.prov.Wire().GetDetail(); !strings.HasPrefix(d, "model server not answering: ") || !strings.Contains(d, "connection refused") {
			t.Errorf("detail %q", d)
		}
		if _, _, err := inv.prov.Acquire(); !errors.Is(err, ErrProviderOffline) || !strings.Contains(err.Error(), "model server not answering") {
			t.Errorf("Acquire: %v", err)
		}

		time.Sleep(10 * time.Minute) // attempt after attempt fails
		synctest.Wait()
		pl := inv.current()
		if n := inv.launches.Load(); n != 1 || pl.closed.Load() {
			t.Fatalf("%d launches (closed %v): a server that does not answer failed the plugin", n, pl.closed.Load())
		}
		wantState(t, inv.prov, wirepb.ProviderState_PROVIDER_STATE_OFFLINE)
		// Backoff from 1s, then never more often than every half interval
		// (jitter) nor less often than every interval.
		if n := pl.lists.Load(); n < 10*60/30 || n > 6+10*60/15 {
			t.Errorf("%d listings in 10 minutes", n)
		}

		base := inv.changes.Load()
		srv.serve("m", "n")
		time.Sleep(every)
		synctest.Wait()
		wantState(t, inv.prov, wirepb.ProviderState_PROVIDER_STATE_ONLINE, "m", "n")
		if d := inv.prov.Wire().GetDetail(); d != "" {
			t.Errorf("online with detail %q", d)
		}
		if n := inv.changes.Load() - base; n != 1 {
			t.Errorf("%d change notifications for coming online, want 1", n)
		}
		if _, release, err := inv.prov.Acquire(); err != nil {
			t.Errorf("Acquire once online: %v", err)
		} else {
			release()
		}
	})
}

// P1: a Node and its model server often start together. While the server
// has not answered, the first listings come a second or so apart, so the
// provider is online within seconds of the server, not an interval later.
func TestModelServerStartingWithTheNodeIsFoundWithinSeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &modelServer{}
		srv.fail(errRefused)
		_, inv := startInventoried(t, srv, nil, time.Hour, discard())
		wantState(t, inv.prov, wirepb.ProviderState_PROVIDER_STATE_OFFLINE)
		srv.serve("m")
		time.Sleep(DefaultSupervision.Unlisted.Initial)
		synctest.Wait()
		wantState(t, inv.prov, wirepb.ProviderState_PROVIDER_STATE_ONLINE, "m")
	})
}

// P1: targets the configuration lists are the provider's targets; the
// model server is never asked for its own, at start or later, and its
// being down changes nothing.
func TestConfiguredTargetsAreNeverListed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &modelServer{}
		srv.fail(errRefused)
		_, inv := startInventoried(t, srv, []string{"x"}, time.Second, discard())
		wantState(t, inv.prov, wirepb.ProviderState_PROVIDER_STATE_ONLINE, "x")
		srv.serve("y")
		time.Sleep(time.Minute)
		synctest.Wait()
		wantState(t, inv.prov, wirepb.ProviderState_PROVIDER_STATE_ONLINE, "x")
		if n := inv.current().lists.Load(); n != 0 {
			t.Errorf("configured targets were listed %d times", n)
		}
		if n := inv.changes.Load(); n != 1 {
			t.Errorf("%d change notifications, want 1 (online)", n)
		}
	})
}

// P1: a listing that fails keeps the last list and the provider online
// (a dead server fails its runs, and a silent one is judged by the stall
// watchdog, R5/R6); nothing is reported to the Edge, and a server that
// stays down is logged once per relistLogEvery, not once per interval.
func TestFailedRelistKeepsTheLastListAndLogsSparingly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const every = 10 * time.Second
		logs := &recordingHandler{}
		srv := &modelServer{}
		srv.serve("a")
		_, inv := startInventoried(t, srv, nil, every, slog.New(logs))
		base := inv.changes.Load()

		srv.fail(errRefused)
		time.Sleep(30 * time.Minute) // 180 failed listings
		synctest.Wait()
		wantState(t, inv.prov, wirepb.ProviderState_PROVIDER_STATE_ONLINE, "a")
		if n := inv.changes.Load() - base; n != 0 {
			t.Errorf("%d change notifications while listings failed, want 0", n)
		}
		// Logged at the first failure (10s), then at 10m10s and 20m10s.
		if n := logs.count(slog.LevelWarn, "keeping the last list"); n != 3 {
			t.Errorf("%d warnings for 180 failed listings in 30 minutes, want 3", n)
		}

		srv.serve("a")
		time.Sleep(every)
		synctest.Wait()
		if n := logs.count(slog.LevelInfo, "lists its targets again"); n != 1 {
			t.Errorf("%d lines saying the server lists again, want 1", n)
		}
		if n := inv.changes.Load() - base; n != 0 {
			t.Errorf("%d change notifications for the same list, want 0", n)
		}
	})
}

// R6, P1: a target marked unavailable after a stall that the server then
// stops listing is no longer probed: its mark goes with it.
func TestRemovedTargetIsNoLongerProbed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const every = 10 * time.Second
		srv := &modelServer{}
		srv.serve("a", "b")
		_, inv := startInventoried(t, srv, nil, every, discard())
		pl := inv.current()
		pl.probe = health(sdk.HealthUnavailable)
		inv.prov.observe("a", Evidence{HealthUnavailable, LivenessProviderUnhealthy})
		time.Sleep(time.Minute)
		synctest.Wait()
		if !inv.prov.TargetUnhealthy("a") || pl.probes.Load() == 0 {
			t.Fatalf("the stalled target is not being probed (unhealthy %v, %d probes)", inv.prov.TargetUnhealthy("a"), pl.probes.Load())
		}
		srv.serve("b")
		time.Sleep(every + DefaultSupervision.Recovery.Max)
		synctest.Wait()
		probes := pl.probes.Load()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if inv.prov.TargetUnhealthy("a") || pl.probes.Load() != probes {
			t.Errorf("a target no longer listed is still marked (%v) or probed (%d → %d)", inv.prov.TargetUnhealthy("a"), probes, pl.probes.Load())
		}
	})
}

// recordingHandler keeps every log record, whatever logger it came through.
type recordingHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

// count is the number of records at level whose message contains msg.
func (h *recordingHandler) count(level slog.Level, msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.recs {
		if r.Level == level && strings.Contains(r.Message, msg) {
			n++
		}
	}
	return n
}

// Two listings in flight at once, as a periodic one beside the one after a
// management call (issue 23): whichever finishes last, the list of the one
// that started last stands, so a model pulled between their starts is not
// taken out again by the older list.
func TestAnOlderListingFinishingLastDoesNotReplaceANewerList(t *testing.T) {
	p := NewProvider(ProviderConfig{Name: "ollama", Adapter: "ollama", Capacity: 1}, DefaultSupervision, discard(), func() {})
	p.replaceTargets([]string{"old:latest", "new:latest"}, 2) // started second, done first
	p.replaceTargets([]string{"old:latest"}, 1)               // started first, done last
	if !p.Serves("new:latest") {
		t.Fatalf("targets %v: the older listing replaced the newer one's", p.Wire().GetTargets())
	}
	p.replaceTargets([]string{"old:latest"}, 3)
	if p.Serves("new:latest") {
		t.Fatalf("targets %v: a newer listing's list was dropped", p.Wire().GetTargets())
	}
}
