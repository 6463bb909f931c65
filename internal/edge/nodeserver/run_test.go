package nodeserver_test

import (
	"context"
	"io"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// A run whose Node generation is fenced mid-run ends with exactly one
// DISCONNECTED terminal (R9), then io.EOF.
func TestRunOnAFencedGenerationEndsDisconnected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		n := h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
			st.Send(textEvent(1, "first"))
			<-ctx.Done()
		})))
		conn := h.waitReady("n1")
		rs, err := e.srv.Run(t.Context(), "n1", &wirepb.RunRequest{RunId: "r1"})
		if err != nil {
			t.Fatal(err)
		}
		if ev, err := rs.Next(); err != nil || ev.GetText() != "first" {
			t.Fatalf("first event: %v %v", ev, err)
		}
		n.faults.SilenceHeartbeatAcks.Store(true)
		<-conn.Fenced()
		ev, err := rs.Next()
		if err != nil || ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED {
			t.Fatalf("after the fence: %v %v, want a DISCONNECTED terminal", ev, err)
		}
		if _, err := rs.Next(); err != io.EOF {
			t.Fatalf("after the terminal: %v, want io.EOF", err)
		}
	})
}

// R10: cancelling the run's context cancels it on the Node (whose handler
// sees the cancel even while silent) and yields one CANCELLED terminal.
func TestCancellingARunReachesTheNodeDuringSilence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		sawCancel := make(chan error, 1)
		h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
			// A silent prefill: the handler only reads, as the Node's run
			// path does to learn of a cancel.
			sawCancel <- st.Recv(new(wirepb.RunEvent))
		})))
		h.waitReady("n1")
		ctx, cancel := context.WithCancel(t.Context())
		rs, err := e.srv.Run(ctx, "n1", &wirepb.RunRequest{RunId: "r1"})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		cancel()
		select {
		case err := <-sawCancel:
			if sc, ok := err.(*quicwire.StreamCancelledError); !ok || sc.Code != quicwire.StreamCancelled {
				t.Errorf("node saw %v, want the stream cancelled", err)
			}
		case <-time.After(time.Second):
			t.Fatal("the cancel never reached the silent node")
		}
		if ev, err := rs.Next(); err != nil || ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED {
			t.Fatalf("cancelled run: %v %v", ev, err)
		}
	})
}
