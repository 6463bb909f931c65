package integration

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	fleet1 "github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// inProcessEdge is a real Edge transport in the test process, so tests can
// send runs with its Go API (the client HTTP API is the next layer up) to
// real noded processes over real QUIC on 127.0.0.1.
type inProcessEdge struct {
	srv  *nodeserver.Server
	reg  *fleet1.Registry
	addr string
}

func startInProcessEdge(t testing.TB) *inProcessEdge {
	t.Helper()
	return startInProcessEdgeWith(t, quicwire.DefaultLiveness)
}

// startInProcessEdgeWith runs the Edge with a liveness profile (tests that
// need a prefill longer than the response wait scale it down).
func startInProcessEdgeWith(t testing.TB, live quicwire.Liveness) *inProcessEdge {
	t.Helper()
	tlsConf, err := quicwire.LoopbackEdgeTLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", tlsConf, transport.EdgeQUICConfig(live))
	if err != nil {
		t.Fatal(err)
	}
	reg := fleet1.New(fleet1.Options{GenerationBase: uint64(time.Now().UnixMilli())})
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv := nodeserver.NewServer(nodeserver.Options{EdgeID: "edge-test", Liveness: live, Logger: log}, reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		srv.Shutdown(sctx)
		cancel()
		ln.Close()
		<-done
	})
	return &inProcessEdge{srv: srv, reg: reg, addr: ln.Addr().String()}
}

// startBenchEdge is startInProcessEdge for benchmarks.
func startBenchEdge(b *testing.B) *inProcessEdge { return startInProcessEdge(b) }

// providerOnline reports whether node id is ready with provider online.
func (e *inProcessEdge) providerOnline(id, provider string) bool {
	c, err := e.reg.Dispatchable(id)
	if err != nil {
		return false
	}
	for _, p := range c.Providers() {
		if p.GetName() == provider && p.GetState() == wirepb.ProviderState_PROVIDER_STATE_ONLINE {
			return true
		}
	}
	return false
}

// waitProvider waits until node id is ready with provider online.
func (e *inProcessEdge) waitProvider(t *testing.T, id, provider string) *fleet1.Conn {
	t.Helper()
	waitFor(t, id+" ready with "+provider+" online", func() bool { return e.providerOnline(id, provider) })
	c, _ := e.reg.Dispatchable(id)
	return c
}

// collect reads a run to its terminal.
func collect(t *testing.T, rs *nodeserver.RunStream) []*wirepb.RunEvent {
	t.Helper()
	var evs []*wirepb.RunEvent
	for {
		ev, err := rs.Next()
		if err != nil {
			t.Fatalf("Next: %v (after %v)", err, evs)
		}
		evs = append(evs, ev)
		if ev.GetType().IsTerminal() {
			return evs
		}
	}
}

// textOf joins the text deltas of evs.
func textOf(evs []*wirepb.RunEvent) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.GetType() == wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA {
			b.WriteString(ev.GetText())
		}
	}
	return b.String()
}
