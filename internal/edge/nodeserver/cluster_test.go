package nodeserver_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	nodetransport "github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/pki"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Issue 22: several Edges, and every Node connected to every one of them.
// These tests run real Edges and a real Node cluster client over the
// in-memory network, in fake time.

// memDirectory is an in-memory cluster Edge list (the PostgreSQL one is
// the cluster package's).
type memDirectory struct {
	mu      sync.Mutex
	edges   []nodeserver.Edge
	changed chan struct{}
}

func newMemDirectory() *memDirectory { return &memDirectory{changed: make(chan struct{})} }

func (d *memDirectory) Edges() []nodeserver.Edge {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.edges)
}

func (d *memDirectory) Changed() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.changed
}

// set replaces the list with the given Edges.
func (d *memDirectory) set(es ...*clusterEdge) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.edges = d.edges[:0]
	for _, e := range es {
		d.edges = append(d.edges, nodeserver.Edge{ID: e.id, QUICAddr: e.addr})
	}
	close(d.changed)
	d.changed = make(chan struct{})
}

// clusterEdge is one Edge of a test cluster.
type clusterEdge struct {
	id, addr string
	*edgeInstance
}

// startClusterEdge starts Edge id on a new address, telling its Nodes dir.
func (h *harness) startClusterEdge(id string, dir nodeserver.EdgeDirectory) *clusterEdge {
	h.t.Helper()
	pc := h.packetConn()
	return &clusterEdge{id: id, addr: pc.LocalAddr().String(), edgeInstance: h.edgeOn(pc, 0, id, dir)}
}

// twoEdges starts Edges e1 and e2, each telling its Nodes both.
func (h *harness) twoEdges() (*memDirectory, *clusterEdge, *clusterEdge) {
	h.t.Helper()
	dir := newMemDirectory()
	e1, e2 := h.startClusterEdge("e1", dir), h.startClusterEdge("e2", dir)
	dir.set(e1, e2)
	return dir, e1, e2
}

// waitOnBoth waits until node id is ready on e1 and e2.
func (h *harness) waitOnBoth(id string, e1, e2 *clusterEdge) {
	h.t.Helper()
	h.waitFor(id+" on both edges", 30*time.Second, func() bool { return e1.holds(id) && e2.holds(id) })
}

// holds reports whether e has node id ready to take work.
func (e *clusterEdge) holds(id string) bool {
	_, err := e.reg.Dispatchable(id)
	return err == nil
}

// clusterNode is a Node's cluster client.
type clusterNode struct {
	c      *nodetransport.Cluster
	log    *syncBuffer
	cancel context.CancelFunc
	done   chan struct{}
}

// startClusterNode starts Node id with seeds, serving streams with
// handler (nil: none), its total capacity capacity, one static provider.
func (h *harness) startClusterNode(id string, seeds []string, capacity int, handler nodetransport.Handler) *clusterNode {
	h.t.Helper()
	return h.startClusterNodeWith(id, seeds, capacity, handler, nodetransport.StaticProviders([]*wirepb.Provider{{
		Name: "sim", Adapter: "simulator", Capacity: uint32(capacity), State: wirepb.ProviderState_PROVIDER_STATE_ONLINE,
		Targets: []*wirepb.Target{{Name: "sim-small"}},
	}}))
}

// startClusterNodeWith is startClusterNode with providers.
func (h *harness) startClusterNodeWith(id string, seeds []string, capacity int, handler nodetransport.Handler, providers nodetransport.Providers) *clusterNode {
	h.t.Helper()
	n := &clusterNode{log: new(syncBuffer), done: make(chan struct{})}
	log := slog.New(slog.NewTextHandler(n.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, err := nodetransport.NewCluster(nodetransport.ClusterOptions{
		Seeds: seeds,
		TLS:   h.clusterNodeTLS(id),
		Client: nodetransport.Options{
			NodeID:    id,
			Version:   "test",
			Liveness:  h.live,
			Backoff:   nodetransport.Backoff{Initial: time.Second, Max: 4 * time.Second},
			Capacity:  capacity,
			Providers: providers,
			Handler:   handler,
		},
		PacketConn: h.packetConn,
		Logger:     log,
	})
	if err != nil {
		h.t.Fatal(err)
	}
	n.c = c
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() {
		defer close(n.done)
		c.Run(ctx)
	}()
	h.t.Cleanup(func() { cancel(); <-n.done })
	return n
}

// clusterNodeTLS is how Node id dials each Edge: in managed mode, with a
// certificate of its own, accepting at a listed address only the Edge
// the list names there (any Edge of the trust domain at a seed); in
// loopback mode, loopback addresses only.
func (h *harness) clusterNodeTLS(id string) func(addr, edgeID string) (*tls.Config, error) {
	if h.ca == nil {
		return func(addr, _ string) (*tls.Config, error) {
			if !quicwire.IsLoopbackAddr(addr) {
				return nil, errors.New("loopback mode dials loopback addresses only")
			}
			return quicwire.LoopbackNodeTLSConfig(), nil
		}
	}
	cert, err := h.ca.IssueTLS(quicwire.NodeIdentity(h.trustDomain, id), pki.Options{NotBefore: notBefore, Validity: 100 * 365 * 24 * time.Hour})
	if err != nil {
		h.t.Fatal(err)
	}
	return func(_, edgeID string) (*tls.Config, error) {
		if edgeID == "" {
			edgeID = h.seedEdgeID // noded's identity.edge_id
		}
		return quicwire.NodeTLSConfig(h.ca.Pool(), cert, h.trustDomain, edgeID, nil), nil
	}
}

// edge returns n's connection to addr, if it has one.
func (n *clusterNode) edge(addr string) (nodetransport.EdgeStatus, bool) {
	for _, e := range n.c.Edges() {
		if e.Addr == addr {
			return e, true
		}
	}
	return nodetransport.EdgeStatus{}, false
}

func TestANodeLearnsAThirdEdgeFromTheListAndConnects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		dir, e1, e2 := h.twoEdges()
		n := h.startClusterNode("n1", []string{e1.addr}, 2, nil)
		h.waitOnBoth("n1", e1, e2)

		e3 := h.startClusterEdge("e3", dir)
		dir.set(e1, e2, e3)
		h.waitFor("n1 on the third edge", 30*time.Second, func() bool { return e3.holds("n1") })
		if got := len(n.c.Edges()); got != 3 {
			t.Fatalf("%d edge connections, want 3 (the seed's edge is not dialled twice): %+v", got, n.c.Edges())
		}
		// The seed and the listed address of e1 are one connection: e1
		// holds generation 1 of n1, never superseded.
		if c, _ := e1.reg.Dispatchable("n1"); c.Generation() != 1 {
			t.Errorf("n1 on e1 at generation %d, want 1", c.Generation())
		}

		// Step 2: an Edge the list leaves out is dropped: its connection
		// closed at once.
		dir.set(e1, e2)
		h.waitFor("n1 gone from e3", 30*time.Second, func() bool {
			_, ok := n.edge(e3.addr)
			return !ok && !e3.holds("n1")
		})
		if !e1.holds("n1") || !e2.holds("n1") {
			t.Errorf("n1 left e1 or e2 when e3 was dropped")
		}
		// A seed is never forgotten: when another Edge's list leaves it
		// out its connection is closed and dialled again, after the
		// reconnect's jittered backoff (a second attempt's when e1 has not
		// yet seen the first connection end): e1 holds a later generation.
		dir.set(e2)
		h.waitFor("the seed e1 dialled again", 30*time.Second, func() bool {
			c, err := e1.reg.Dispatchable("n1")
			return err == nil && c.Generation() > 1
		})
		if _, ok := n.edge(e1.addr); !ok {
			t.Errorf("the seed e1 was dropped when the list left it out")
		}
	})
}

// synctestSettle lets fake time pass for d, for what should not happen.
func synctestSettle(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

func TestOneEdgeUnreachableTheNodeServesThroughTheOther(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		dead := h.packetConn().LocalAddr().String() // nothing listens here
		e2 := h.startClusterEdge("e2", nil)
		n := h.startClusterNode("n1", []string{dead, e2.addr}, 2, handlerFunc(func(ctx context.Context, sess *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream) {
			_ = st.Send(&wirepb.RunEvent{Seq: 1, Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED})
		}))
		// Ready as soon as one Edge is: the other does not hold it back.
		h.waitFor("n1 ready on e2", 30*time.Second, func() bool { return e2.holds("n1") && n.c.Ready() })
		rs, err := e2.srv.Run(t.Context(), "n1", &wirepb.RunRequest{RunId: "r1", Target: "sim-small"})
		if err != nil {
			t.Fatal(err)
		}
		if ev, err := rs.Next(); err != nil || ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
			t.Fatalf("run through e2: %v, %v", ev, err)
		}
		if st, _ := n.edge(dead); st.State == nodetransport.StateReady {
			t.Fatalf("the unreachable edge shows ready")
		}
	})
}

func TestAnEdgesStoppingNoticeReachesTheNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		_, e1, e2 := h.twoEdges()
		n := h.startClusterNode("n1", []string{e1.addr, e2.addr}, 2, nil)
		h.waitOnBoth("n1", e1, e2)

		e1.srv.Stopping("upgrade")
		h.waitFor("the node told e1 stops", 10*time.Second, func() bool {
			st, _ := n.edge(e1.addr)
			return st.Stopping && st.StoppingReason == "upgrade"
		})
		if st, _ := n.edge(e2.addr); st.Stopping {
			t.Errorf("e2 shows stopping too")
		}
		// Still ready: through e2, which is not stopping.
		h.waitFor("n1 ready through e2", 10*time.Second, n.c.Ready)
		// A Node registering on a stopping Edge is told at once.
		n2 := h.startClusterNode("n2", []string{e1.addr}, 2, nil)
		h.waitFor("n2 told e1 stops", 30*time.Second, func() bool {
			st, _ := n2.edge(e1.addr)
			return st.Stopping
		})
	})
}

// slotHandler is a Node's provider of capacity slots, shared by all its
// Edge connections: a run past them is refused busy, as the execution
// handler does; an admitted run holds its slot until release is closed.
type slotHandler struct {
	slots   chan struct{}
	release chan struct{}
	running atomic.Int32
	most    atomic.Int32
	busy    atomic.Int32
}

func (s *slotHandler) ServeStream(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
	select {
	case s.slots <- struct{}{}:
	default:
		if nodetransport.BusyRefusals(ctx) {
			s.busy.Add(1)
			st.Cancel(quicwire.StreamBusy)
			return
		}
		_ = st.Send(&wirepb.RunEvent{Seq: 1, Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED}})
		return
	}
	defer func() { <-s.slots }()
	n := s.running.Add(1)
	defer s.running.Add(-1)
	for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
	}
	_ = st.Send(&wirepb.RunEvent{Seq: 1, Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: "a"})
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	_ = st.Send(&wirepb.RunEvent{Seq: 2, Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED})
}

// Two Edges can never oversubscribe a Node: with capacity 2, two runs from
// one Edge hold it, a third from the other is refused busy before its
// first byte (a CAPACITY_EXHAUSTED node_busy failure the dispatcher moves
// or requeues), and served once a slot is free.
func TestTwoEdgesNeverOversubscribeANode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		_, e1, e2 := h.twoEdges()
		sh := &slotHandler{slots: make(chan struct{}, 2), release: make(chan struct{})}
		h.startClusterNode("n1", []string{e1.addr}, 2, sh)
		h.waitOnBoth("n1", e1, e2)

		var held []*nodeserver.RunStream
		for _, id := range []string{"a", "b"} {
			rs, err := e1.srv.Run(t.Context(), "n1", &wirepb.RunRequest{RunId: id, Target: "sim-small"})
			if err != nil {
				t.Fatal(err)
			}
			if ev, err := rs.Next(); err != nil || ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA {
				t.Fatalf("run %s: %v, %v", id, ev, err)
			}
			held = append(held, rs)
		}
		rs, err := e2.srv.Run(t.Context(), "n1", &wirepb.RunRequest{RunId: "c", Target: "sim-small"})
		if err != nil {
			t.Fatal(err)
		}
		ev, _ := rs.Next()
		if f := ev.GetFailure(); ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_FAILED ||
			f.GetKind() != wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED || f.GetReason() != nodeserver.BusyReason || !f.GetRetryable() {
			t.Fatalf("the third run: %v, want a retryable capacity_exhausted %s failure", ev, nodeserver.BusyReason)
		}
		if sh.busy.Load() != 1 || e2.srv.BusyRefusals() != 1 {
			t.Errorf("busy refusals: node %d, edge %d; want 1 and 1", sh.busy.Load(), e2.srv.BusyRefusals())
		}

		close(sh.release)
		for _, rs := range held {
			for {
				if _, err := rs.Next(); err == io.EOF {
					break
				}
			}
		}
		synctest.Wait()
		rs, err = e2.srv.Run(t.Context(), "n1", &wirepb.RunRequest{RunId: "c", Target: "sim-small"})
		if err != nil {
			t.Fatal(err)
		}
		if ev, err := rs.Next(); err != nil || ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA {
			t.Fatalf("the third run once a slot is free: %v, %v", ev, err)
		}
		rs.Close()
		if most := sh.most.Load(); most > 2 {
			t.Errorf("%d runs at once on a Node of capacity 2", most)
		}
	})
}

// The same through each Edge's own scheduler and dispatcher, as an Edge
// serves clients: runs from two Edges to one Node of capacity 2 never run
// more than 2 at once; the one the Node refuses busy waits (its provider
// marked full on that Edge) and is served once a slot is free, without a
// failover and without an error to its client.
func TestTwoEdgesDispatchingToOneNodeShareItsCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		_, e1, e2 := h.twoEdges()
		sh := &slotHandler{slots: make(chan struct{}, 2), release: make(chan struct{})}
		h.startClusterNode("n1", []string{e1.addr}, 2, sh)
		h.waitOnBoth("n1", e1, e2)
		cfg, err := edgeconfig.Parse([]byte("listen: {http: \"127.0.0.1:8080\", quic: \"127.0.0.1:7443\"}\nidentity: {mode: loopback}\n"))
		if err != nil {
			t.Fatal(err)
		}
		dispatcher := func(e *clusterEdge) *dispatch.Dispatcher {
			s := sched.New(e.reg, sched.Options{})
			go s.Run(t.Context())
			return dispatch.New(cfg, dispatch.SchedulerSlots(s), dispatch.ServerNodes(e.srv), dispatch.Options{})
		}
		d1, d2 := dispatcher(e1), dispatcher(e2)
		start := func(d *dispatch.Dispatcher) (*dispatch.Run, error) {
			plan, err := d.Resolve(auth.Principal{Name: "p", Routes: []string{edgeconfig.AllRoutes}}, "sim-small")
			if err != nil {
				return nil, err
			}
			return d.StartRun(t.Context(), &plan, &wirepb.RunRequest{}, dispatch.Watch{})
		}
		for range 2 {
			if _, err := start(d1); err != nil {
				t.Fatal(err)
			}
		}
		third := make(chan error, 1)
		go func() {
			r, err := start(d2)
			if err == nil {
				defer r.Close()
				var ev *wirepb.RunEvent
				if ev, err = r.Next(); err == nil && ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA {
					err = fmt.Errorf("first event %v", ev)
				}
			}
			third <- err
		}()
		time.Sleep(2 * time.Second) // refused busy, and waiting
		synctest.Wait()
		select {
		case err := <-third:
			t.Fatalf("the third run ended while the Node was full: %v", err)
		default:
		}
		// Refused, and retried only as the full mark's backoff ends
		// (this Node reports no slots in use): no retry loop.
		if n := sh.busy.Load(); n == 0 || n > int32(2*time.Second/sched.FullBackoff)+1 {
			t.Fatalf("the Node refused the third run busy %d times in 2 s; want 1 to %d", n, 2*time.Second/sched.FullBackoff+1)
		}
		close(sh.release)
		if err := <-third; err != nil {
			t.Fatalf("the third run once a slot is free: %v", err)
		}
		if most := sh.most.Load(); most > 2 {
			t.Errorf("%d runs at once on a Node of capacity 2", most)
		}
		t.Logf("busy refusals before the third run was served: %d in 2 s", sh.busy.Load())
	})
}

// Managed mode: a Node dials a listed Edge accepting only the certificate
// of the Edge the list names at that address, and keeps one connection per
// Edge (the seed's Edge, listed at its own address, is not dialled again).
func TestAListedEdgeMustPresentTheListedIdentity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t, managed)
		dir := newMemDirectory()
		e1, e2 := h.startClusterEdge("e1", dir), h.startClusterEdge("e2", dir)
		// The list says e3 is at e2's address: e2's certificate names e2.
		dir.set(e1, &clusterEdge{id: "e3", addr: e2.addr})
		n := h.startClusterNode("n1", []string{e1.addr}, 2, nil)
		h.waitFor("n1 on e1", 30*time.Second, func() bool { return e1.holds("n1") })
		synctestSettle(10 * time.Second)
		if _, err := e2.reg.Dispatchable("n1"); err == nil {
			t.Fatal("n1 registered with e2, listed as e3")
		}
		st, ok := n.edge(e2.addr)
		if !ok || st.State == nodetransport.StateReady || st.LastError == nil {
			t.Fatalf("the connection to the mislisted address: %+v (listed %v)", st, ok)
		}
		// Listed as itself, e2 is joined; e1 still at generation 1.
		dir.set(e1, e2)
		h.waitFor("n1 on e2 once listed as itself", 30*time.Second, func() bool { return e2.holds("n1") })
		if c, _ := e1.reg.Dispatchable("n1"); c.Generation() != 1 {
			t.Errorf("n1 on e1 at generation %d, want 1", c.Generation())
		}
	})
}

// slotsInUse is a provider snapshot with inUse slots taken.
func slotsInUse(inUse uint32) []*wirepb.Provider {
	return []*wirepb.Provider{{Name: "sim", Adapter: "simulator", Capacity: 2, InUse: inUse,
		State: wirepb.ProviderState_PROVIDER_STATE_ONLINE, Targets: []*wirepb.Target{{Name: "sim-small"}}}}
}

// What the Node reports of its providers (here its slots in use) reaches
// every Edge it is connected to.
func TestProviderStatusReachesEveryEdge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		_, e1, e2 := h.twoEdges()
		ps := &mutableProviders{changed: make(chan struct{}), ps: slotsInUse(0)}
		h.startClusterNodeWith("n1", []string{e1.addr}, 2, nil, ps)
		h.waitOnBoth("n1", e1, e2)
		inUse := func(e *clusterEdge) uint32 {
			c, err := e.reg.Dispatchable("n1")
			if err != nil {
				return 0
			}
			return c.Providers()[0].GetInUse()
		}
		ps.set(slotsInUse(2))
		h.waitFor("both edges told 2 slots in use", 5*time.Second, func() bool { return inUse(e1) == 2 && inUse(e2) == 2 })
		ps.set(slotsInUse(1))
		ps.set(slotsInUse(0)) // within the rate limit: the last state still goes out
		h.waitFor("both edges told 0 slots in use", 5*time.Second, func() bool { return inUse(e1) == 0 && inUse(e2) == 0 })
	})
}

// alsoAt makes e answer at a second address too (as behind a load
// balancer or a second name), and returns it.
func (h *harness) alsoAt(e *clusterEdge) string {
	h.t.Helper()
	pc := h.packetConn()
	ln, err := e.listen(pc)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.srv.Serve(ctx, ln)
	}()
	h.t.Cleanup(func() { cancel(); ln.Close(); <-done })
	return pc.LocalAddr().String()
}

// One Edge is one connection, by its id: the Edge a seed reaches is not
// dialled again at its listed address, and two seeds that reach one Edge
// do not both register there (the second is turned away before it
// registers, so the first is never superseded).
func TestOneEdgeIsOneConnectionWhateverItsAddresses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t, managed)
		_, e1, e2 := h.twoEdges()
		alias := h.alsoAt(e1)
		n := h.startClusterNode("n1", []string{alias, e1.addr}, 2, nil)
		h.waitOnBoth("n1", e1, e2)
		synctestSettle(30 * time.Second)
		if c, _ := e1.reg.Dispatchable("n1"); c.Generation() != 1 {
			t.Errorf("n1 on e1 at generation %d, want 1: two connections of it took turns there", c.Generation())
		}
		var addrs []string
		held := 0
		for _, e := range n.c.Edges() {
			addrs = append(addrs, e.Addr)
			if e.State == nodetransport.StateReady && e.EdgeID == "e1" {
				held++
			}
		}
		if want := []string{alias, e1.addr, e2.addr}; !slices.Equal(addrs, want) || held != 1 {
			t.Errorf("connections %q with %d ready on e1; want %q (two seeds and e2 from the list), one on e1", addrs, held, want)
		}
	})
}

// identity.edge_id (which noded join writes) constrains the configured
// address only: the Edge accepted there vouches for the Edges it lists,
// which the Node joins with the ids the list names. A seed that is not
// that Edge is refused.
func TestAPinnedSeedVouchesForTheEdgesItLists(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t, managed)
		_, e1, e2 := h.twoEdges()
		h.seedEdgeID = "e1"
		h.startClusterNode("n1", []string{e1.addr}, 2, nil)
		h.waitOnBoth("n1", e1, e2)

		h.seedEdgeID = "e2"
		h.startClusterNode("n2", []string{e1.addr}, 2, nil)
		synctestSettle(10 * time.Second)
		if e1.holds("n2") || e2.holds("n2") {
			t.Errorf("n2, pinned to e2, registered through e1's address")
		}
	})
}

// The cost of a Node's connection to one more Edge, idle: the packets and
// bytes both ways per second (the Node's 1 s keep-alive, each side's 30 s
// heartbeat, and their acknowledgements), measured over ten minutes of
// fake time. It is what a Node pays per Edge of its cluster.
func TestAnIdleEdgeConnectionCostsAFewPacketsASecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		_, e1, e2 := h.twoEdges()
		h.startClusterNode("n1", []string{e1.addr}, 2, nil)
		h.waitOnBoth("n1", e1, e2)
		synctestSettle(time.Minute)
		p0, b0 := h.router.sent.Load(), h.router.bytes.Load()
		const span = 10 * time.Minute
		synctestSettle(span)
		conns := 2.0
		pps := float64(h.router.sent.Load()-p0) / span.Seconds() / conns
		bps := float64(h.router.bytes.Load()-b0) / span.Seconds() / conns
		t.Logf("idle edge connection: %.2f packets/s, %.0f bytes/s (both ways)", pps, bps)
		if pps > 5 {
			t.Errorf("an idle connection sends %.2f packets a second, want a few at most", pps)
		}
	})
}
