package nodeserver_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/edge/fleet"
	nodetransport "github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// These tests run the real 30 s / 45 s liveness profile in a synctest
// bubble over quic-go's in-memory network: fake time, real QUIC.

// gatedProviders are not up until open is called.
type gatedProviders struct {
	once sync.Once
	up   chan struct{}
}

func newGatedProviders() *gatedProviders { return &gatedProviders{up: make(chan struct{})} }

func (g *gatedProviders) open() { g.once.Do(func() { close(g.up) }) }

func (g *gatedProviders) Snapshot() []*wirepb.Provider {
	return []*wirepb.Provider{{Name: "sim", Adapter: "simulator", Capacity: 1, Targets: []*wirepb.Target{{Name: "sim-small"}}}}
}

func (g *gatedProviders) WaitReady(ctx context.Context) error {
	select {
	case <-g.up:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gatedProviders) Changed() <-chan struct{} { return nil }

// R1: nothing is dispatched to a Node that registered but is not ready.
func TestRegisteredButNotReadyGetsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		gate := newGatedProviders()
		served := make(chan *wirepb.StreamHeader, 1)
		h.startNode("n1", func(o *nodetransport.Options) { o.Providers = gate },
			withHandler(handlerFunc(func(ctx context.Context, sess *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream) {
				served <- hdr
			})))

		h.waitFor("n1 registering", 10*time.Second, func() bool {
			c, ok := e.reg.Current("n1")
			return ok && c.State() == fleet.Registering
		})
		// Registered for a whole minute, providers still not up.
		time.Sleep(time.Minute)
		_, err := e.srv.Dispatch(t.Context(), "n1", runHeader("r1"))
		var nd *fleet.NotDispatchableError
		if !errors.As(err, &nd) || nd.State != fleet.Registering {
			t.Fatalf("Dispatch to a registering node: got %v, want NotDispatchableError in state registering", err)
		}

		gate.open()
		conn := h.waitReady("n1")
		ds, err := e.srv.Dispatch(t.Context(), "n1", runHeader("r1"))
		if err != nil {
			t.Fatalf("Dispatch to a ready node: %v", err)
		}
		defer ds.Cancel(quicwire.StreamCancelled)
		hdr := <-served
		if hdr.GetGeneration() != conn.Generation() || hdr.GetRun().GetRunId() != "r1" {
			t.Fatalf("node got header %v, want run r1 on generation %d", hdr, conn.Generation())
		}
	})
}

// R9: a Node that stops answering heartbeats while QUIC stays alive is
// fenced exactly one response wait after the unanswered heartbeat, with
// close reason heartbeat_timeout; its streams end with a disconnect
// outcome; it comes back with generation + 1 after its backoff.
func TestHeartbeatTimeoutFencesAtResponseWait(t *testing.T) {
	forEachNetwork(t, func(t *testing.T, h *harness) {
		e := h.startEdge(0)
		handlerDone := make(chan error, 1)
		n := h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, sess *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream) {
			<-ctx.Done() // a long run, bound to the connection
			handlerDone <- ctx.Err()
		})))
		n.faults.SilenceHeartbeatAcks.Store(true) // before the first heartbeat at +30 s
		conn := h.waitReady("n1")
		ds, err := e.srv.Dispatch(t.Context(), "n1", runHeader("r1"))
		if err != nil {
			t.Fatal(err)
		}

		select {
		case <-conn.Fenced():
		case <-time.After(10 * time.Minute):
			t.Fatal("node that answers no heartbeat was never fenced")
		}
		// The Edge's first heartbeat leaves one interval after registration;
		// the verdict comes exactly one response wait after that. (Exact in
		// fake time; on real UDP only the order holds.)
		got, want := conn.FencedAt().Sub(conn.ConnectedAt()), h.live.Interval+h.live.ResponseWait
		if h.sim && got != want || got < want {
			t.Errorf("fenced %v after registration, want exactly %v", got, want)
		}
		if code, _, _ := conn.FenceReason(); code != quicwire.CloseHeartbeatTimeout {
			t.Errorf("fence reason %s, want heartbeat_timeout", code)
		}

		// The dispatched stream ends with a disconnect outcome.
		err = ds.Recv(new(wirepb.RunEvent))
		if !errors.Is(err, quicwire.ErrDisconnected) {
			t.Errorf("Recv on a fenced generation's stream: %v, want ErrDisconnected", err)
		}
		// The Node's handler was cancelled with its connection.
		select {
		case <-handlerDone:
		case <-time.After(time.Minute):
			t.Error("node handler outlived its connection")
		}

		fencedAt := time.Now()
		n.faults.SilenceHeartbeatAcks.Store(false)
		next := h.waitReady("n1")
		if next.Generation() != conn.Generation()+1 {
			t.Errorf("came back with generation %d, want %d", next.Generation(), conn.Generation()+1)
		}
		if wait := next.ConnectedAt().Sub(fencedAt); h.sim && wait < 500*time.Millisecond {
			t.Errorf("reconnected %v after the fence, before the minimum backoff of 500ms", wait)
		}
		st := n.c.Status()
		var cc *quicwire.ConnClosedError
		if !errors.As(st.LastError, &cc) || cc.Code != quicwire.CloseHeartbeatTimeout || !cc.Remote {
			t.Errorf("node saw its connection end with %v, want heartbeat_timeout from the edge", st.LastError)
		}
	})
}

// R9: a black-holed link (every packet dropped) is detected and fenced;
// the Node reconnects when the link returns.
func TestBlackholedLinkIsFencedAndNodeReconnects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		n := h.startNode("n1")
		conn := h.waitReady("n1")

		h.router.blackhole.Store(true)
		start := time.Now()
		<-conn.Fenced()
		live := quicwire.DefaultLiveness
		if took := time.Since(start); took > live.Interval+live.ResponseWait {
			t.Errorf("black hole detected after %v, want at most %v", took, live.Interval+live.ResponseWait)
		}
		if code, _, _ := conn.FenceReason(); code != quicwire.CloseHeartbeatTimeout {
			t.Errorf("fence reason %s, want heartbeat_timeout", code)
		}
		// The Node notices on its own: its heartbeats go unanswered too.
		h.waitFor("node notices the dead link", 2*time.Minute, func() bool {
			return n.c.Status().State == nodetransport.StateConnecting
		})

		time.Sleep(time.Minute) // dial attempts fail while the link is down
		if _, err := e.reg.Dispatchable("n1"); err == nil {
			t.Fatal("node dispatchable while its link is black-holed")
		}
		h.router.blackhole.Store(false)
		next := h.waitReady("n1")
		if next.Generation() <= conn.Generation() {
			t.Errorf("generation %d after reconnect, want above %d", next.Generation(), conn.Generation())
		}
	})
}

// R8: ten minutes of silent prefill on a run stream is not a dead link.
func TestTenMinutesOfSilentPrefillKeepsTheConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, sess *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream) {
			select {
			case <-time.After(10 * time.Minute): // prefill: not a byte
			case <-ctx.Done():
				return
			}
			st.Send(textEvent(1, "first token"))
			st.Send(&wirepb.RunEvent{Seq: 2, Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED})
		})))
		conn := h.waitReady("n1")
		ds, err := e.srv.Dispatch(t.Context(), "n1", runHeader("r1"))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		ev := new(wirepb.RunEvent)
		if err := ds.Recv(ev); err != nil {
			t.Fatalf("first event after the prefill: %v", err)
		}
		if waited := time.Since(start); waited < 10*time.Minute {
			t.Errorf("first event after %v, want the full 10 minute prefill", waited)
		}
		if err := ds.Recv(ev); err != nil || ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
			t.Fatalf("terminal: %v %v", ev, err)
		}
		if c, err := e.reg.Dispatchable("n1"); err != nil || c != conn {
			t.Fatalf("after the prefill the node is %v (%v), want the same ready generation", c, err)
		}
	})
}

// Decision 2: heartbeats keep flowing, and are answered promptly, while 64
// dispatched streams are blocked by readers that never read, in both
// directions.
func TestHeartbeatsFlowWhileStreamsAreUnread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		floodUnreadStreams(t, h, e)
		if _, err := e.reg.Dispatchable("n1"); err != nil {
			t.Fatalf("node fenced while streams were unread: %v", err)
		}
		for _, v := range e.reg.Snapshot() {
			if v.LastHeartbeatRTTMillis == nil || time.Since(*v.LastHeartbeatAt) > quicwire.DefaultLiveness.Interval {
				t.Fatalf("edge heartbeats unanswered: %+v", v)
			}
			if *v.LastHeartbeatRTTMillis > 100 {
				t.Errorf("edge heartbeat RTT %.1f ms on a 4 ms link: control stream delayed", *v.LastHeartbeatRTTMillis)
			}
		}
	})
}

// The control experiment: with quic-go's default auto-tuned windows, the
// same unread streams use up the Edge's connection window and the control
// stream stops while QUIC stays up (quic-go issue 3294). This is what the
// fixed windows of transport.EdgeQUICConfig prevent, and shows the test above
// can fail.
func TestDefaultWindowsLetUnreadStreamsStarveHeartbeats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		h.edgeQUIC = &quic.Config{MaxIdleTimeout: h.live.IdleTimeout(), KeepAlivePeriod: h.live.KeepAlive()}
		e := h.startEdge(0)
		conn := floodUnreadStreams(t, h, e)
		if code, _, fenced := conn.FenceReason(); !fenced || code != quicwire.CloseHeartbeatTimeout {
			t.Fatalf("with default windows the node is %s (fenced=%v), expected the heartbeat to starve", code, fenced)
		}
	})
}

// floodUnreadStreams dispatches 64 streams whose reader never reads, half
// flooded by the Node and half by the Edge, and lets 5 minutes pass.
func floodUnreadStreams(t *testing.T, h *harness, e *edgeInstance) *fleet.Conn {
	chunk := make([]byte, 512<<10)
	n := h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, sess *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream) {
		if hdr.GetRun().GetRunId() == "edge-writes" {
			<-ctx.Done() // never read what the Edge sends
			return
		}
		// Flood a reader (the Edge) that never reads.
		for seq := uint64(1); ctx.Err() == nil; seq++ {
			if err := st.Send(&wirepb.RunEvent{Seq: seq, Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: string(chunk)}); err != nil {
				return
			}
		}
	})))
	conn := h.waitReady("n1")
	var streams []interface{ Cancel(quicwire.StreamCode) }
	for i := range 64 {
		id := "node-writes"
		if i%2 == 1 {
			id = "edge-writes"
		}
		ds, err := e.srv.Dispatch(t.Context(), "n1", runHeader(id))
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, ds)
		if id == "edge-writes" {
			go func() {
				for ds.Send(&wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: chunk}}) == nil {
				}
			}()
		}
	}
	t.Cleanup(func() {
		for _, s := range streams {
			s.Cancel(quicwire.StreamCancelled)
		}
	})

	time.Sleep(5 * time.Minute)
	if rtt := n.c.Status().LastRTT; conn.State() != fleet.Fenced && (rtt == 0 || rtt > 100*time.Millisecond) {
		t.Errorf("node heartbeat RTT %v on a 4 ms link", rtt)
	}
	return conn
}

// R9: a second connection with the same identity fences the first.
func TestSecondConnectionSupersedesTheFirst(t *testing.T) {
	forEachNetwork(t, func(t *testing.T, h *harness) {
		h.startEdge(0)
		first := h.startNode("n1")
		old := h.waitReady("n1")

		h.startNode("n1")
		<-old.Fenced()
		if code, _, _ := old.FenceReason(); code != quicwire.CloseSuperseded {
			t.Errorf("old generation fenced with %s, want superseded", code)
		}
		h.waitFor("old connection told it was superseded", 5*time.Second, func() bool {
			var cc *quicwire.ConnClosedError
			return errors.As(first.c.Status().LastError, &cc) && cc.Code == quicwire.CloseSuperseded && cc.Remote
		})
		first.stop() // the old process would be gone; keep it from coming back
		cur := h.waitReady("n1")
		if cur.Generation() != old.Generation()+1 {
			t.Errorf("new generation %d, want %d", cur.Generation(), old.Generation()+1)
		}
	})
}

// R9: after an Edge restart every Node comes back ready by itself, with a
// new generation.
func TestEdgeRestartNodesComeBack(t *testing.T) {
	forEachNetwork(t, func(t *testing.T, h *harness) {
		e := h.startEdge(1000)
		n1, n2 := h.startNode("n1"), h.startNode("n2")
		g1, g2 := h.waitReady("n1").Generation(), h.waitReady("n2").Generation()

		h.stopEdge(e)
		for _, n := range []*nodeInstance{n1, n2} {
			h.waitFor("node sees the edge go", time.Minute, func() bool {
				var cc *quicwire.ConnClosedError
				return errors.As(n.c.Status().LastError, &cc) && cc.Code == quicwire.CloseShutdown
			})
		}
		time.Sleep(h.live.Interval) // the Edge is down for a while
		h.startEdge(2000)           // a later start time: higher generations
		if c := h.waitReady("n1"); c.Generation() <= g1 {
			t.Errorf("n1 generation %d after restart, want above %d", c.Generation(), g1)
		}
		if c := h.waitReady("n2"); c.Generation() <= g2 {
			t.Errorf("n2 generation %d after restart, want above %d", c.Generation(), g2)
		}
	})
}
