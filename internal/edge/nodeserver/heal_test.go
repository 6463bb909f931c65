package nodeserver_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/fleet"
	nodetransport "github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// P4, issue 26: heard from again is not ready. A cut link heals, packets
// from the Node arrive again, but its answers do not (here: the Node
// withholds its heartbeat answers, as a Node whose QUIC sender still backs
// off the cut's retransmissions answers nothing). The Node stays suspect
// and gets no new work; the first heartbeat answered after the silence
// makes it dispatchable at once, on the same generation. Before, it was
// dispatchable the moment a packet arrived, and work sent then waited for
// the heartbeat's fence.
func TestAHealedNodeStaysSuspectUntilAHeartbeatIsAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		n := h.startNode("n1", oneConnection, withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
			st.Send(textEvent(1, "ok"))
			st.Send(&wirepb.RunEvent{Seq: 2, Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED})
		})))
		conn := h.waitReady("n1")
		n.faults.SilenceHeartbeatAcks.Store(true)
		h.router.blackhole.Store(true)
		h.waitSuspect(conn, time.Minute)
		time.Sleep(5 * time.Second)
		h.router.blackhole.Store(false)
		h.waitFor("heard from again", 20*time.Second, func() bool { return strings.Contains(h.edgeLog.String(), "node heard from again") })

		// Packets flow both ways; answers do not. No new work.
		time.Sleep(5 * time.Second)
		var nd *fleet.NotDispatchableError
		if _, err := e.reg.Dispatchable("n1"); !errors.As(err, &nd) || !nd.Suspect {
			t.Fatalf("heard from again, no heartbeat answered: Dispatchable = %v, want suspect", err)
		}
		if _, err := e.srv.Dispatch(t.Context(), "n1", runHeader("r0")); !errors.As(err, &nd) || !nd.Suspect {
			t.Fatalf("dispatch to a node heard from again but unanswered: %v, want refused as suspect", err)
		}
		if conn.HeardAgain().IsZero() {
			t.Errorf("the registry does not say the node was heard from again")
		}

		// The Node answers again: the next heartbeat the Edge sends is
		// answered, and that answer makes it dispatchable.
		n.faults.SilenceHeartbeatAcks.Store(false)
		h.waitFor("suspicion ended", h.live.Interval+5*time.Second, func() bool { _, ok := conn.Suspect(); return !ok })
		cleared := time.Now()
		if _, at := conn.HeardAgain(), lastAnswer(t, e, "n1"); at.IsZero() || cleared.Sub(at) > 100*time.Millisecond {
			t.Errorf("suspicion ended at %v, the last heartbeat answer came at %v: want it to end with the answer", cleared, at)
		}
		if conn.State() != fleet.Ready {
			t.Fatalf("after the answer the generation is %s, want ready (suspicion is not a fence)", conn.State())
		}
		if c, err := e.reg.Dispatchable("n1"); err != nil || c != conn {
			t.Fatalf("after the answer: %v, %v; want the same generation dispatchable", c, err)
		}
		rs, err := e.srv.Run(t.Context(), "n1", &wirepb.RunRequest{RunId: "r1"})
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		if ev, err := rs.Next(); err != nil || ev.GetText() != "ok" {
			t.Fatalf("a run after the answer: %v %v", ev, err)
		}
		if !strings.Contains(h.edgeLog.String(), "answered a heartbeat sent after its silence") {
			t.Errorf("the edge did not log the answer that ended the suspicion:\n%s", h.edgeLog)
		}
	})
}

// P4, issue 26: a healed link whose Node answers is dispatchable within a
// moment of the Edge hearing it again: the Edge probes with a fresh
// heartbeat then, and does not wait for the retransmission of the one it
// sent into the silence, nor for its next scheduled heartbeat. (How soon
// the Node is heard after the heal is the Node's QUIC sender's business,
// and its fresh connection's: blocked here.)
func TestAHealedNodeThatAnswersIsDispatchableWithinAMomentOfTheHeal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		h.startNode("n1", oneConnection)
		conn := h.waitReady("n1")
		h.router.blackhole.Store(true)
		h.waitSuspect(conn, time.Minute)
		time.Sleep(20 * time.Second)
		h.router.blackhole.Store(false)
		healed := time.Now()
		h.waitFor("suspicion ended", 30*time.Second, func() bool { _, ok := conn.Suspect(); return !ok })
		// After a 20 s cut the Node's QUIC sender takes a few seconds to
		// send again (its retransmissions back off); then one round trip.
		if took := time.Since(healed); took > 5*time.Second {
			t.Errorf("dispatchable %v after the heal", took)
		}
		if !strings.Contains(h.edgeLog.String(), "answered a heartbeat sent after its silence") {
			t.Errorf("the suspicion did not end with a heartbeat's answer:\n%s", h.edgeLog)
		}
		if c, err := e.reg.Dispatchable("n1"); err != nil || c != conn {
			t.Fatalf("after the heal: %v, %v; want the same generation dispatchable", c, err)
		}
	})
}

// lastAnswer is when the Edge last had a heartbeat of its own answered by
// node id.
func lastAnswer(t *testing.T, e *edgeInstance, id string) time.Time {
	t.Helper()
	for _, v := range e.reg.Snapshot() {
		if v.ID == id && v.LastHeartbeatAt != nil {
			return *v.LastHeartbeatAt
		}
	}
	return time.Time{}
}

// oneConnection keeps the Node on its first connection: once that one is
// up, no handshake packet of the Node gets through, so a fresh connection
// it dials beside a silent one (the Node's side of issue 26) never
// registers. These tests are about the Edge's trust in the old connection.
func oneConnection(o *nodetransport.Options) {
	o.PacketConn = &noNewConnections{PacketConn: o.PacketConn}
}

// noNewConnections drops the long-header (handshake) packets a Node sends
// once its first connection has sent a short-header one (RFC 9000 17.2:
// the first bit of a long header is set).
type noNewConnections struct {
	net.PacketConn
	established atomic.Bool
}

func (c *noNewConnections) WriteTo(p []byte, addr net.Addr) (int, error) {
	if len(p) > 0 && p[0]&0x80 == 0 {
		c.established.Store(true)
	} else if c.established.Load() {
		return len(p), nil
	}
	return c.PacketConn.WriteTo(p, addr)
}

// Issue 26: one Node identity presented by two connections that keep
// superseding each other (two copies of n1, each reconnecting when the
// other fences it) is a warning in the Edge's log, with both remote
// addresses, at most once a minute, and counted in the registry.
func TestTwoCopiesOfANodeThatKeepSupersedingEachOtherAreWarnedAbout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		a := h.startNode("n1")
		h.waitReady("n1")
		b := h.startNode("n1")
		h.waitFor("a contested identity", time.Minute, func() bool { return e.reg.Contested()["n1"] > 0 })
		time.Sleep(30 * time.Second)
		a.stop()
		b.stop()
		log := h.edgeLog.String()
		if n := strings.Count(log, "node identity contested"); n != 1 {
			t.Fatalf("warned %d times within a minute, want once:\n%s", n, log)
		}
		line := log[strings.Index(log, "node identity contested"):]
		line = line[:strings.IndexByte(line, '\n')]
		if !strings.Contains(line, "addr=127.0.0.1:") || !strings.Contains(line, "previous_addr=127.0.0.1:") {
			t.Errorf("the warning does not name both remote addresses: %s", line)
		}
		if n := e.reg.Contested()["n1"]; n < 2 {
			t.Errorf("counted %d contested supersedes over 30 s of fighting, want them all counted", n)
		}
	})
}
