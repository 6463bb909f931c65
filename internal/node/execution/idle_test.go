package execution

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// parking is a provider under test whose adapter gives a route and whose
// plugin is stopped after idleStop without calls: every launch is a new
// routePlugin that answers runs with exec and lists list (if set).
type parking struct {
	prov     *Provider
	set      *Set
	launches atomic.Int32
	mu       sync.Mutex
	plugins  []*routePlugin
	fail     error // the next launches fail with it
}

const idleStop = time.Minute

// listingRoutePlugin is a routePlugin that lists its server's targets.
type listingRoutePlugin struct{ *routePlugin }

func (listingRoutePlugin) Capabilities() []string {
	return []string{sdk.CapTunnelRoute, sdk.CapListTargets}
}

func startParking(t *testing.T, targets []string, list func(context.Context) ([]sdk.Target, error), exec func(ctx context.Context, req *wirepb.RunRequest, emit func(*wirepb.RunEvent) error) (*sdk.Result, error)) *parking {
	t.Helper()
	pk := &parking{set: NewSet()}
	sup := DefaultSupervision
	sup.Backoff = edgeclient.Backoff{Initial: time.Second, Max: time.Second}
	pk.prov = NewProvider(ProviderConfig{Name: "p", Adapter: "ollama", Targets: targets, Capacity: 4, IdleStop: idleStop,
		Launch: func(context.Context) (Plugin, error) {
			pk.launches.Add(1)
			pk.mu.Lock()
			defer pk.mu.Unlock()
			if pk.fail != nil {
				return nil, pk.fail
			}
			pl := newRoutePlugin("http://127.0.0.1:1")
			pl.exec = exec
			pk.plugins = append(pk.plugins, pl)
			if list != nil {
				pl.list = list
				return listingRoutePlugin{pl}, nil
			}
			return pl, nil
		}}, sup, discard(), pk.set.Notify)
	pk.set.Add(pk.prov)
	pk.set.Start()
	t.Cleanup(pk.set.Stop)
	if err := pk.set.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	return pk
}

// running counts the launched plugins not closed.
func (pk *parking) running() int {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	n := 0
	for _, pl := range pk.plugins {
		if !pl.closed.Load() {
			n++
		}
	}
	return n
}

func (pk *parking) latest() *routePlugin {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	return pk.plugins[len(pk.plugins)-1]
}

func (pk *parking) failLaunches(err error) {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	pk.fail = err
}

// runOn makes one run through the provider as the run path does: a slot,
// then the plugin's Execute.
func runOn(t *testing.T, p *Provider) (*wirepb.RunEvent, error) {
	t.Helper()
	pl, release, err := p.Acquire()
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer release()
	return pl.Execute(t.Context(), run("r"), nil, func(*wirepb.RunEvent) error { return nil })
}

// A provider whose adapter gives a route has no plugin process once its
// first start has learned its capabilities and route: it is online, and a
// normalized run starts a process, which is stopped again after the idle
// period and not before.
func TestRoutedProviderRunsNoIdlePlugin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pk := startParking(t, []string{"m"}, nil, idle)
		if n := pk.running(); n != 0 || pk.launches.Load() != 1 {
			t.Fatalf("after the first start: %d plugins running of %d launched, want none of 1", n, pk.launches.Load())
		}
		if !pk.prov.Online() || pk.prov.tunnelRoute() == nil {
			t.Fatalf("provider online %v with route %v, want online with its route", pk.prov.Online(), pk.prov.tunnelRoute())
		}

		term, err := runOn(t, pk.prov)
		if err != nil || term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
			t.Fatalf("the first run after the plugin was stopped: %v, %v", term, err)
		}
		if n := pk.running(); n != 1 || pk.launches.Load() != 2 {
			t.Fatalf("after a run: %d plugins running of %d launched, want 1 of 2", n, pk.launches.Load())
		}
		time.Sleep(idleStop - time.Millisecond)
		synctest.Wait()
		if _, err := runOn(t, pk.prov); err != nil || pk.running() != 1 || pk.launches.Load() != 2 {
			t.Fatalf("a run within the idle period: %v, %d running of %d launched, want the same plugin", err, pk.running(), pk.launches.Load())
		}
		time.Sleep(idleStop - time.Millisecond)
		synctest.Wait()
		if pk.running() != 1 {
			t.Fatal("stopped before the idle period since the last run")
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if n := pk.running(); n != 0 {
			t.Fatalf("%d plugins running an idle period after the last run, want none", n)
		}
		if !pk.prov.Online() || pk.prov.Circuit() != "closed" {
			t.Errorf("an idle stop moved the provider: online %v, circuit %s", pk.prov.Online(), pk.prov.Circuit())
		}
	})
}

// Runs that arrive together while no plugin runs share one start, and a
// run in flight is never stopped under, however long it lasts.
func TestConcurrentRunsShareOneStartAndHoldThePlugin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		long := make(chan struct{})
		pk := startParking(t, []string{"m"}, nil, func(ctx context.Context, req *wirepb.RunRequest, emit func(*wirepb.RunEvent) error) (*sdk.Result, error) {
			<-long
			return &sdk.Result{}, nil
		})
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				if _, err := runOn(t, pk.prov); err != nil {
					t.Errorf("run: %v", err)
				}
			})
		}
		synctest.Wait()
		if pk.launches.Load() != 2 {
			t.Fatalf("%d launches for three runs at once, want one after the first start", pk.launches.Load()-1)
		}
		time.Sleep(3 * idleStop)
		synctest.Wait()
		if pk.running() != 1 {
			t.Fatal("the plugin was stopped under runs in flight")
		}
		close(long)
		wg.Wait()
		time.Sleep(idleStop)
		synctest.Wait()
		if pk.running() != 0 {
			t.Fatal("not stopped an idle period after the runs ended")
		}
	})
}

// P1 holds while the plugin is stopped: a relisting starts it, finds the
// server's change, and lets it go at once; the provider's targets follow
// the server and it stays online.
func TestRelistingWakesThePluginAndLetsItGo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &modelServer{}
		srv.serve("a")
		pk := startParking(t, nil, srv.list, idle)
		if pk.running() != 0 || !pk.prov.Serves("a") {
			t.Fatalf("after the first start: %d running, targets %v", pk.running(), wireTargets(pk.prov))
		}
		srv.serve("a", "b")
		time.Sleep(DefaultRelistInterval)
		synctest.Wait()
		if !pk.prov.Serves("b") || pk.launches.Load() != 2 {
			t.Fatalf("after one interval: targets %v, %d launches, want b listed by a second launch", wireTargets(pk.prov), pk.launches.Load())
		}
		if n := pk.running(); n != 0 {
			t.Fatalf("%d plugins running after a relisting, want none: listing does not hold the plugin", n)
		}
		wantState(t, pk.prov, wirepb.ProviderState_PROVIDER_STATE_ONLINE, "a", "b")
	})
}

// A plugin started for a run that then crashes is a crash like any other:
// the run fails provider_unavailable, the provider goes offline and is
// restarted with backoff (counted as a restart), and comes back online
// without a resident plugin.
func TestWokenPluginThatCrashesIsRestarted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		started, crashed := make(chan struct{}), make(chan struct{})
		var first sync.Once
		pk := startParking(t, []string{"m"}, nil, func(ctx context.Context, req *wirepb.RunRequest, emit func(*wirepb.RunEvent) error) (*sdk.Result, error) {
			hold := false
			first.Do(func() { close(started); hold = true })
			if hold {
				<-crashed // what the host's call returns when the process dies
				return nil, sdk.ErrUnavailable
			}
			return &sdk.Result{}, nil
		})
		ran := make(chan error, 1)
		go func() { _, err := runOn(t, pk.prov); ran <- err }()
		<-started
		pk.latest().exit() // the process dies mid-run
		close(crashed)
		if err := <-ran; sdk.KindOf(err) != sdk.KindUnavailable {
			t.Errorf("the run on the crashed plugin: %v, want unavailable", err)
		}
		synctest.Wait()
		if pk.prov.Online() {
			t.Fatal("still online after the woken plugin crashed")
		}
		time.Sleep(time.Second) // the backoff
		synctest.Wait()
		if !pk.prov.Online() || pk.launches.Load() != 3 || pk.running() != 0 {
			t.Fatalf("after the restart: online %v, %d launches, %d running; want online, 3, none", pk.prov.Online(), pk.launches.Load(), pk.running())
		}
		if _, err := runOn(t, pk.prov); err != nil {
			t.Errorf("a run after the restart: %v", err)
		}
	})
}

// A plugin that cannot be started for a run fails that run as
// provider_unavailable, and the provider goes through Supervise's restart
// path, circuit breaker included.
func TestPluginThatFailsToWakeFailsTheRunAndRestarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pk := startParking(t, []string{"m"}, nil, idle)
		pk.failLaunches(errors.New("exec: no such file"))
		_, err := runOn(t, pk.prov)
		if sdk.KindOf(err) != sdk.KindUnavailable {
			t.Fatalf("run whose plugin did not start: %v, want unavailable", err)
		}
		synctest.Wait()
		if pk.prov.Online() {
			t.Fatal("online after its plugin failed to start")
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if pk.prov.Circuit() != "open" {
			t.Errorf("circuit %s after the plugin kept failing, want open", pk.prov.Circuit())
		}
		pk.failLaunches(nil)
		time.Sleep(DefaultSupervision.BreakerCooldown)
		synctest.Wait()
		if !pk.prov.Online() || pk.running() != 0 {
			t.Errorf("after the cooldown: online %v with %d running, want online with none", pk.prov.Online(), pk.running())
		}
	})
}

// A run whose client goes away while the plugin starts returns at once;
// the start goes on, and the plugin it brought up is stopped when idle.
func TestCallerGoneDuringStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pk := startParking(t, []string{"m"}, nil, idle)
		gate := make(chan struct{})
		pk.prov.cfg.Launch = func(launch Launcher) Launcher {
			return func(ctx context.Context) (Plugin, error) { <-gate; return launch(ctx) }
		}(pk.prov.cfg.Launch)
		pl, release, err := pk.prov.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { _, err := pl.Execute(ctx, run("r"), nil, nil); done <- err }()
		synctest.Wait()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("run cancelled during the start: %v", err)
		}
		release()
		close(gate)
		synctest.Wait()
		if pk.running() != 0 || !pk.prov.Online() {
			t.Fatalf("%d running, online %v: want the plugin nobody waits for stopped, the provider online", pk.running(), pk.prov.Online())
		}
	})
}

// Without IdleStop, or without a route, the plugin stays up as before.
func TestPluginStaysWithoutIdleStopOrRoute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, c := range []struct {
			name  string
			idle  time.Duration
			route bool
		}{{"no idle stop", 0, true}, {"no route", time.Minute, false}} {
			var pl Plugin
			fp := newFakePlugin(idle)
			pl = fp
			if c.route {
				rp := newRoutePlugin("http://127.0.0.1:1")
				fp, pl = rp.fakePlugin, rp
			}
			set := NewSet()
			set.Add(NewProvider(ProviderConfig{Name: "p", Targets: []string{"m"}, IdleStop: c.idle,
				Launch: func(context.Context) (Plugin, error) { return pl, nil }}, DefaultSupervision, discard(), set.Notify))
			set.Start()
			time.Sleep(time.Hour)
			synctest.Wait()
			if fp.closed.Load() {
				t.Errorf("%s: the plugin was stopped", c.name)
			}
			set.Stop()
		}
	})
}
