package nodeserver_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	nodetransport "github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// waitSuspect waits until conn is suspect and returns when that was seen.
func (h *harness) waitSuspect(conn *fleet.Conn, within time.Duration) time.Time {
	h.t.Helper()
	h.waitFor("node suspect", within, func() bool { _, ok := conn.Suspect(); return ok })
	return time.Now()
}

// P4 with R8/R9: a Node whose link goes dark is suspect SuspectAfter later
// (plus one sample), gets no new work from then on, and is fenced with
// heartbeat_timeout exactly one response wait after suspicion, because the
// Edge sends a heartbeat the moment it suspects. Before suspicion existed
// the verdict took up to an interval plus the wait (75 s).
func TestADarkLinkIsSuspectInSecondsAndFencedByTheHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		h.startNode("n1")
		conn := h.waitReady("n1")
		time.Sleep(10 * time.Second) // idle: keep-alives alone keep it heard from
		if _, ok := conn.Suspect(); ok {
			t.Fatal("an idle but healthy node was suspected")
		}

		h.router.blackhole.Store(true)
		dark := time.Now()
		suspected := h.waitSuspect(conn, time.Minute)
		// The silence began at the last packet, up to a keep-alive before
		// the link went dark; it is noticed within a sample of After.
		after := h.live.SuspectAfter()
		if took := suspected.Sub(dark); took < after-h.live.KeepAlive()-time.Second || took > after+2*time.Second {
			t.Errorf("suspect %v after the link went dark, want about %v", took, after)
		}
		var nd *fleet.NotDispatchableError
		if _, err := e.srv.Dispatch(t.Context(), "n1", runHeader("r1")); !errors.As(err, &nd) || !nd.Suspect {
			t.Errorf("dispatch to a suspect node: %v, want a NotDispatchableError saying suspect", err)
		}
		if !strings.Contains(h.edgeLog.String(), "node suspect") {
			t.Errorf("the edge did not log the suspicion:\n%s", h.edgeLog)
		}

		<-conn.Fenced()
		if got := conn.FencedAt().Sub(suspected); got < h.live.ResponseWait-time.Second || got > h.live.ResponseWait+time.Second {
			t.Errorf("fenced %v after suspicion, want the response wait %v (the probe heartbeat's)", got, h.live.ResponseWait)
		}
		if code, _, _ := conn.FenceReason(); code != quicwire.CloseHeartbeatTimeout {
			t.Errorf("fence reason %s, want heartbeat_timeout: the heartbeat, not suspicion, decides", code)
		}
		if took := conn.FencedAt().Sub(dark); took > after+2*time.Second+h.live.ResponseWait {
			t.Errorf("fenced %v after the link went dark", took)
		}
	})
}

// P4: a suspect Node heard from again (the link healed before the
// heartbeat's verdict) is dispatchable again, on the same generation, once
// it answers a heartbeat sent after its silence (issue 26): suspicion
// never fences.
func TestASuspectNodeHeardFromAgainIsDispatchableAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
			st.Send(textEvent(1, "ok"))
			st.Send(&wirepb.RunEvent{Seq: 2, Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED})
		})))
		conn := h.waitReady("n1")
		h.router.blackhole.Store(true)
		h.waitSuspect(conn, time.Minute)
		time.Sleep(10 * time.Second)
		h.router.blackhole.Store(false)
		healed := time.Now()
		h.waitFor("suspicion cleared", 10*time.Second, func() bool { _, ok := conn.Suspect(); return !ok })
		if took := time.Since(healed); took > 3*time.Second {
			t.Errorf("suspicion cleared %v after the link healed", took)
		}
		if c, err := e.reg.Dispatchable("n1"); err != nil || c != conn {
			t.Fatalf("after the heal: %v, %v; want the same generation dispatchable", c, err)
		}
		rs, err := e.srv.Run(t.Context(), "n1", &wirepb.RunRequest{RunId: "r1"})
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		if ev, err := rs.Next(); err != nil || ev.GetText() != "ok" {
			t.Fatalf("a run after the heal: %v %v", ev, err)
		}
		if !strings.Contains(h.edgeLog.String(), "node heard from again") {
			t.Errorf("the edge did not log the recovery:\n%s", h.edgeLog)
		}
	})
}

// P4: a run that has produced nothing can be given up (its Node turned
// suspect): the Node's handler sees the cancel once the link allows, and
// Next yields one DISCONNECTED terminal that says why. A run that has
// produced an event can no longer be given up this way.
func TestAbandonEndsOnlyARunThatHasProducedNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		var mu sync.Mutex
		cancelled := map[string]bool{}
		h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream) {
			id := hdr.GetRun().GetRunId()
			if id == "talks" {
				st.Send(textEvent(1, "first"))
			}
			err := st.Recv(new(wirepb.RunEvent)) // until cancelled
			mu.Lock()
			cancelled[id] = err != nil && !errors.Is(err, io.EOF)
			mu.Unlock()
		})))
		h.waitReady("n1")

		silent, err := e.srv.Run(t.Context(), "n1", &wirepb.RunRequest{RunId: "silent"})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // a silent prefill
		if !silent.Abandon(errors.New("node n1 turned suspect")) {
			t.Fatal("Abandon of a run that produced nothing reported false")
		}
		ev, err := silent.Next()
		if err != nil || ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED || !strings.Contains(ev.GetFailure().GetMessage(), "turned suspect") {
			t.Fatalf("after Abandon: %v %v, want DISCONNECTED saying why", ev, err)
		}
		if _, err := silent.Next(); err != io.EOF {
			t.Fatalf("after the terminal: %v, want io.EOF", err)
		}

		talks, err := e.srv.Run(t.Context(), "n1", &wirepb.RunRequest{RunId: "talks"})
		if err != nil {
			t.Fatal(err)
		}
		defer talks.Close()
		if ev, err := talks.Next(); err != nil || ev.GetText() != "first" {
			t.Fatalf("first event: %v %v", ev, err)
		}
		if talks.Abandon(errors.New("too late")) {
			t.Fatal("Abandon of a run that has produced an event reported true")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if !cancelled["silent"] {
			t.Error("the abandoned run was not cancelled on the Node")
		}
		if _, done := cancelled["talks"]; done {
			t.Error("the run that had produced output was cancelled by a late Abandon")
		}
	})
}

// P4: an Edge that crashes (no CONNECTION_CLOSE leaves it) and restarts
// with the same stateless reset key answers its Nodes' old connections with
// a stateless reset: they reconnect within seconds of the restart. With
// another key the Node cannot recognise the resets; it used to wait for
// its own heartbeat's verdict (45 s), and now its fresh connection, dialled
// beside the silent one, is back within seconds too (issue 26).
func TestARestartedEdgeWithItsResetKeyGetsNodesBackInSeconds(t *testing.T) {
	for _, c := range []struct {
		name      string
		sameKey   bool
		atMost    time.Duration
		atLeast   time.Duration
		wantReset bool
	}{
		{"same key", true, quicwire.DefaultLiveness.SuspectAfter() + 4*time.Second, 0, true},
		{"another key", false, quicwire.DefaultLiveness.SuspectAfter() + 4*time.Second, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newSimHarness(t)
				var key quic.StatelessResetKey
				rand.Read(key[:])
				h.resetKey = &key
				e := h.startEdge(1000)
				n := h.startNode("n1")
				g := h.waitReady("n1").Generation()

				h.crashEdge(e)
				time.Sleep(time.Second)
				if !c.sameKey {
					h.resetKey = nil // a fresh random key
				}
				h.startEdge(2000)
				restarted := time.Now()
				h.waitFor("n1 back", 3*time.Minute, func() bool {
					conn, err := h.current().reg.Dispatchable("n1")
					return err == nil && conn.Generation() > g
				})
				took := time.Since(restarted)
				if took > c.atMost || took < c.atLeast {
					t.Errorf("n1 back %v after the restart, want between %v and %v", took, c.atLeast, c.atMost)
				}
				if st := n.c.Status(); st.Connects != 2 {
					t.Errorf("node connected %d times, want 2", st.Connects)
				}
				last := n.c.Status().LastError // why the first connection ended
				var reset *quic.StatelessResetError
				if got := errors.As(last, &reset); got != c.wantReset {
					t.Errorf("the old connection ended with %v; stateless reset: %v, want %v", last, got, c.wantReset)
				}
			})
		})
	}
}

// Issues 10 and 13: an admin read or a /metrics scrape (the registry
// snapshot, which asks each connection's fleet.Link for its heartbeat
// round trip) while Nodes register is not a data race: the heartbeat
// exists before the registry publishes the connection. Run with -race. On
// the old order (heartbeat made after Register) every run fails, with a
// DATA RACE report or the nil heartbeat's panic.
func TestReadingTheRegistryWhileNodesRegisterIsNotARace(t *testing.T) {
	h := newUDPHarness(t)
	e := h.startEdge(0)
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					e.reg.Snapshot()
				}
			}
		})
	}
	for _, id := range []string{"n1", "n2", "n3", "n4"} {
		h.startNode(id)
		h.waitReady(id)
	}
	close(stop)
	readers.Wait()
}

// P4: a tunnel whose head has not come can be given up the same way: Head
// returns a DISCONNECTED *TunnelError that says why; once a head came,
// Abandon does nothing.
func TestAbandonEndsOnlyATunnelWithoutAHead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream) {
			readBody(st)
			if hdr.GetTunnel().GetTunnelId() == "answers" {
				st.Send(tHead(200))
			}
			<-ctx.Done()
		})))
		h.waitReady("n1")

		silent, err := e.srv.Tunnel(t.Context(), "n1", tunnelRequest("silent"), nil)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if !silent.Abandon(errors.New("node n1 turned suspect")) {
			t.Fatal("Abandon of a tunnel without a head reported false")
		}
		_, err = silent.Head()
		var te *nodeserver.TunnelError
		if !errors.As(err, &te) || te.Outcome != wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED || !strings.Contains(te.Failure.GetMessage(), "turned suspect") {
			t.Fatalf("Head after Abandon: %v, want a DISCONNECTED tunnel error saying why", err)
		}

		answers, err := e.srv.Tunnel(t.Context(), "n1", tunnelRequest("answers"), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer answers.Close()
		if head, err := answers.Head(); err != nil || head.GetStatus() != 200 {
			t.Fatalf("head: %v %v", head, err)
		}
		if answers.Abandon(errors.New("too late")) {
			t.Fatal("Abandon after the head reported true")
		}
	})
}

// Issue 10 item 4: a Node accepts as many dispatched streams as its
// capacity plus headroom, and says so at registration: 300 runs open at
// once on a Node of capacity 300 (the old fixed limit was 256, and the
// 257th blocked inside the stream open). The generation's Slots match.
func TestANodeAcceptsAStreamForEverySlotItOffers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const capacity = 300
		h := newSimHarness(t)
		e := h.startEdge(0)
		h.startNode("n1", func(o *nodetransport.Options) { o.Capacity = capacity },
			withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
				<-ctx.Done() // a long silent prefill
			})))
		conn := h.waitReady("n1")
		if conn.Slots() != capacity {
			t.Fatalf("Slots = %d, want the node's capacity %d", conn.Slots(), capacity)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		for i := range capacity + quicwire.StreamHeadroom {
			d, err := e.srv.Dispatch(ctx, "n1", runHeader(fmt.Sprintf("r%d", i)))
			if err != nil {
				t.Fatalf("stream %d of %d: %v", i+1, capacity+quicwire.StreamHeadroom, err)
			}
			defer d.Cancel(quicwire.StreamCancelled)
		}
		// One more waits for a free stream no longer than StreamWait, then
		// fails with ErrStreamWait, which the gateway moves on from.
		began := time.Now()
		_, err := e.srv.Dispatch(t.Context(), "n1", runHeader("one-too-many"))
		if !errors.Is(err, nodeserver.ErrStreamWait) || time.Since(began) != 5*time.Second {
			t.Fatalf("a dispatch past the stream limit: %v after %v, want ErrStreamWait after 5s", err, time.Since(began))
		}
	})
}
