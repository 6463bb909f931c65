package nodeserver_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/fleet"
	nodetransport "github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// slowRun completes its run after d, unless its connection ends first. It
// tells started when it begins.
func slowRun(d time.Duration, started chan<- struct{}) handlerFunc {
	return func(ctx context.Context, sess *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream) {
		started <- struct{}{}
		select {
		case <-time.After(d):
			st.Send(&wirepb.RunEvent{Seq: 1, Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED})
		case <-ctx.Done():
		}
	}
}

// A draining Node tells the Edge, which stops dispatching to it, lets the
// in-flight work finish, reads its outcome, and then closes the connection
// with shutdown: nothing in flight is lost to the close.
func TestDrainFinishesInFlightWorkThenClosesWithShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		started := make(chan struct{}, 1)
		n := h.startNode("n1", withHandler(slowRun(20*time.Second, started)))
		conn := h.waitReady("n1")
		ds, err := e.srv.Dispatch(t.Context(), "n1", runHeader("r1"))
		if err != nil {
			t.Fatal(err)
		}
		<-started // the run is in flight on the Node

		drained := make(chan error, 1)
		start := time.Now()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			drained <- n.c.Drain(ctx, "test")
		}()
		h.waitFor("edge marks the node draining", time.Second, func() bool { return conn.State() == fleet.Draining })
		var nd *fleet.NotDispatchableError
		if _, err := e.srv.Dispatch(t.Context(), "n1", runHeader("r2")); !errors.As(err, &nd) || nd.State != fleet.Draining {
			t.Errorf("dispatch to a draining node: %v, want refused as draining", err)
		}
		ev := new(wirepb.RunEvent)
		if err := ds.Recv(ev); err != nil || ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
			t.Fatalf("in-flight run during the drain: %v %v, want completed", ev, err)
		}
		ds.Finish() // the Edge has read the outcome: now the connection may close
		if err := <-drained; err != nil {
			t.Errorf("drain: %v", err)
		}
		if took := time.Since(start); took < 20*time.Second || took > 21*time.Second {
			t.Errorf("drain took %v, want the ~20 s the in-flight run needed", took)
		}
		<-conn.Fenced()
		if code, _, _ := conn.FenceReason(); code != quicwire.CloseShutdown {
			t.Errorf("fenced with %s, want shutdown", code)
		}
		time.Sleep(time.Minute)
		if c, _ := e.reg.Current("n1"); c != conn {
			t.Error("a drained node reconnected")
		}
	})
}

// A drain deadline that passes cancels what is still running: its stream
// ends with a disconnect outcome, and Drain says how many were cut.
func TestDrainDeadlineCutsLongRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		started := make(chan struct{}, 1)
		n := h.startNode("n1", withHandler(slowRun(time.Hour, started)))
		h.waitReady("n1")
		ds, err := e.srv.Dispatch(t.Context(), "n1", runHeader("r1"))
		if err != nil {
			t.Fatal(err)
		}
		<-started
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := n.c.Drain(ctx, "test"); err == nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("drain past its deadline: %v, want a deadline error", err)
		}
		if err := ds.Recv(new(wirepb.RunEvent)); !errors.Is(err, quicwire.ErrDisconnected) {
			t.Errorf("cut run: %v, want ErrDisconnected", err)
		}
	})
}

// The Node joins its stream handlers: when a drain's deadline cuts the
// connection, Run returns only after every handler has returned, here one
// that takes 3 s to let go of its provider call; so the Node's Stop never
// stops the plugins under a handler that is still finishing.
func TestRunReturnsOnlyAfterEveryStreamHandlerReturned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		started := make(chan struct{}, 2)
		var returned atomic.Int32
		lingering := handlerFunc(func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, _ *transport.Stream) {
			started <- struct{}{}
			<-ctx.Done()
			time.Sleep(3 * time.Second) // a provider call slow to return
			returned.Add(1)
		})
		n := h.startNode("n1", withHandler(lingering))
		h.waitReady("n1")
		for _, id := range []string{"r1", "r2"} {
			if _, err := e.srv.Dispatch(t.Context(), "n1", runHeader(id)); err != nil {
				t.Fatal(err)
			}
			<-started
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := n.c.Drain(ctx, "test"); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("drain past its deadline: %v", err)
		}
		n.stop() // cancels Run and waits for it
		if got := returned.Load(); got != 2 {
			t.Errorf("Run returned with %d of 2 stream handlers returned", got)
		}
		if got := n.c.InFlight(); got != 0 {
			t.Errorf("%d streams in flight after Run returned", got)
		}
	})
}

// mutableProviders changes its snapshot on demand.
type mutableProviders struct {
	mu      sync.Mutex
	ps      []*wirepb.Provider
	changed chan struct{}
}

func (m *mutableProviders) Snapshot() []*wirepb.Provider {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ps
}
func (m *mutableProviders) WaitReady(context.Context) error { return nil }
func (m *mutableProviders) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}
func (m *mutableProviders) set(ps []*wirepb.Provider) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ps = ps
	close(m.changed)
	m.changed = make(chan struct{})
}

// A provider that changes on the Node (goes offline, gains a target)
// reaches the Edge as a status update.
func TestProviderStatusUpdatesReachTheEdge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		h.startEdge(0)
		mp := &mutableProviders{changed: make(chan struct{}), ps: []*wirepb.Provider{{Name: "p", State: wirepb.ProviderState_PROVIDER_STATE_ONLINE}}}
		h.startNode("n1", func(o *nodetransport.Options) { o.Providers = mp })
		conn := h.waitReady("n1")
		mp.set([]*wirepb.Provider{{Name: "p", State: wirepb.ProviderState_PROVIDER_STATE_OFFLINE, Targets: []*wirepb.Target{{Name: "m"}}}})
		h.waitFor("edge sees the provider offline", time.Second, func() bool {
			ps := conn.Providers()
			return len(ps) == 1 && ps[0].GetState() == wirepb.ProviderState_PROVIDER_STATE_OFFLINE && len(ps[0].GetTargets()) == 1
		})
	})
}
