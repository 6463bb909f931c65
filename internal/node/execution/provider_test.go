package execution

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

func idle(context.Context, *wirepb.RunRequest, func(*wirepb.RunEvent) error) (*sdk.Result, error) {
	return &sdk.Result{}, nil
}

// A crashed plugin takes its provider offline and is restarted with
// backoff, configured again, and the provider comes back online.
func TestCrashedPluginIsRestartedAndComesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var launches atomic.Int32
		plugins := make(chan *fakePlugin, 10)
		set := NewSet()
		sup := DefaultSupervision
		sup.Backoff = edgeclient.Backoff{Initial: time.Second, Max: time.Second}
		prov := NewProvider(ProviderConfig{Name: "p", Targets: []string{"m"}, Capacity: 1, Launch: func(context.Context) (Plugin, error) {
			launches.Add(1)
			pl := newFakePlugin(idle)
			plugins <- pl
			return pl, nil
		}}, sup, discard(), set.Notify)
		set.Add(prov)
		set.Start()
		defer set.Stop()
		first := <-plugins
		synctest.Wait()
		if got := prov.Wire().GetState(); got != wirepb.ProviderState_PROVIDER_STATE_ONLINE {
			t.Fatalf("state %v, want online", got)
		}
		changed := set.Changed()
		first.exit() // the process dies
		<-changed
		synctest.Wait()
		if got := prov.Wire().GetState(); got != wirepb.ProviderState_PROVIDER_STATE_OFFLINE {
			t.Fatalf("after a crash: %v, want offline", got)
		}
		if _, _, err := prov.Acquire(); !errors.Is(err, ErrProviderOffline) {
			t.Errorf("Acquire while offline: %v", err)
		}
		time.Sleep(time.Second) // the backoff
		<-plugins
		synctest.Wait()
		if got := prov.Wire().GetState(); got != wirepb.ProviderState_PROVIDER_STATE_ONLINE || launches.Load() != 2 {
			t.Fatalf("after restart: %v with %d launches", got, launches.Load())
		}
	})
}

// A plugin that keeps failing opens the circuit: no attempt for the
// cooldown, the provider says why, then one attempt decides.
func TestPluginThatKeepsFailingOpensTheCircuit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var launches []time.Time
		count := func() int { mu.Lock(); defer mu.Unlock(); return len(launches) }
		set := NewSet()
		sup := DefaultSupervision
		prov := NewProvider(ProviderConfig{Name: "p", Capacity: 1, Launch: func(context.Context) (Plugin, error) {
			mu.Lock()
			launches = append(launches, time.Now())
			mu.Unlock()
			return nil, errors.New("boom")
		}}, sup, discard(), set.Notify)
		set.Add(prov)
		set.Start()
		defer set.Stop()
		time.Sleep(time.Minute) // backoffs: well under a minute for 5 attempts
		synctest.Wait()
		if n := count(); n != sup.BreakerThreshold {
			t.Fatalf("%d launches before the circuit opened, want %d", n, sup.BreakerThreshold)
		}
		if w := prov.Wire(); w.GetState() != wirepb.ProviderState_PROVIDER_STATE_OFFLINE || !strings.Contains(w.GetDetail(), "circuit open") {
			t.Fatalf("provider = %v", w)
		}
		mu.Lock()
		opened := launches[len(launches)-1]
		mu.Unlock()
		time.Sleep(time.Until(opened.Add(sup.BreakerCooldown - time.Millisecond)))
		synctest.Wait()
		if n := count(); n != sup.BreakerThreshold {
			t.Fatalf("launched during the cooldown (%d)", n)
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if n := count(); n != sup.BreakerThreshold+1 {
			t.Fatalf("%d launches after the cooldown, want one more", n)
		}
	})
}

// The ready handshake waits for every provider's first attempt, but a
// broken provider does not hold the others back.
func TestWaitReadyWaitsForFirstAttemptsOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		set := NewSet()
		release := make(chan struct{})
		set.Add(NewProvider(ProviderConfig{Name: "broken", Launch: func(context.Context) (Plugin, error) { return nil, errors.New("no") }}, DefaultSupervision, discard(), set.Notify))
		set.Add(NewProvider(ProviderConfig{Name: "slow", Launch: func(context.Context) (Plugin, error) {
			<-release
			return newFakePlugin(idle), nil
		}}, DefaultSupervision, discard(), set.Notify))
		set.Start()
		defer set.Stop()
		ready := make(chan error, 1)
		go func() { ready <- set.WaitReady(t.Context()) }()
		synctest.Wait()
		select {
		case <-ready:
			t.Fatal("ready before the slow provider's first attempt ended")
		default:
		}
		close(release)
		if err := <-ready; err != nil {
			t.Fatal(err)
		}
	})
}
