package ollamaapi

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
	"github.com/iop-dev/iop/internal/edge/sched"

	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The Edge's hop of a raw tunnel, per token: a body read from the Node's
// stream (here a Tunnel that yields one token's line per Read, as the
// Node's frames come), through the Ollama API handler (the final-line
// watch, the exchange's idle timer and write deadline), written and
// flushed to a real HTTP client over loopback TCP. The QUIC receive is
// quicwire's hop (BenchmarkStreamFrames there).
//
// "sparse" yields the next line once the client has read the last (one
// write and flush per token, as when tokens come milliseconds apart);
// "burst" yields them back to back.
//
//	go test -run '^$' -bench TunnelEdgeHop -benchmem ./internal/edge/ollamaapi
func BenchmarkTunnelEdgeHop(b *testing.B) {
	for _, sparse := range []bool{true, false} {
		name := "burst"
		if sparse {
			name = "sparse"
		}
		b.Run(name, func(b *testing.B) { benchEdgeHop(b, sparse) })
	}
}

const (
	benchLine = `{"model":"m1","created_at":"2026-12-01T00:00:00Z","message":{"role":"assistant","content":"tok "},"done":false}` + "\n"
	benchDone = `{"model":"m1","created_at":"2026-12-01T00:00:00Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop"}` + "\n"
)

func benchEdgeHop(b *testing.B, sparse bool) {
	tun := &benchTunnel{n: b.N, read: make(chan struct{}, 1), sparse: sparse}
	tun.ctx, tun.cancel = context.WithCancelCause(context.Background())
	r := &benchRunner{Dispatcher: &ft.Dispatcher{}, tunnel: tun}
	srv := httptest.NewServer(Handler(frontend.New(r, testAuth(b), frontend.Options{Metrics: edgemetrics.New(nil, nil)})))
	defer srv.Close()

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/chat", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+testKey)
	b.ReportAllocs()
	b.ResetTimer()
	resp, err := srv.Client().Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	lines := 0
	for sc.Scan() {
		lines++
		if sparse {
			select { // never blocks: the tunnel takes each before the next line
			case tun.read <- struct{}{}:
			default:
			}
		}
	}
	b.StopTimer()
	if lines != b.N {
		b.Fatalf("the client read %d lines of %d: %v", lines, b.N, sc.Err())
	}
}

// benchRunner starts benchTunnels.
type benchRunner struct {
	*ft.Dispatcher
	tunnel *benchTunnel
}

func (r *benchRunner) StartTunnel(_ context.Context, _ *dispatch.Plan, _ *wirepb.TunnelRequest, body dispatch.TunnelBody, watch dispatch.Watch) (frontend.Tunnel, error) {
	if _, err := body("m1"); err != nil {
		return nil, err
	}
	if watch.Admitted != nil {
		watch.Admitted()
	}
	return r.tunnel, nil
}

// benchTunnel yields n lines, the last one the final (done) line, then
// io.EOF.
type benchTunnel struct {
	n       int
	yielded int
	sparse  bool
	read    chan struct{} // the client read a line (sparse)
	ctx     context.Context
	cancel  context.CancelCauseFunc
}

func (t *benchTunnel) ID() string            { return "tun-bench" }
func (t *benchTunnel) Node() sched.Candidate { return sched.Candidate{NodeID: "n1"} }
func (t *benchTunnel) Head() *wirepb.TunnelResponseHead {
	return &wirepb.TunnelResponseHead{Status: 200, Headers: []*wirepb.Header{{Name: "Content-Type", Value: "application/x-ndjson"}}}
}
func (t *benchTunnel) Context() context.Context { return t.ctx }
func (t *benchTunnel) Cancel(cause error)       { t.cancel(cause) }
func (t *benchTunnel) Close()                   { t.cancel(context.Canceled) }
func (t *benchTunnel) CountUsage(int64, int64)  {}

// Ready: in a burst the next line is always here already.
func (t *benchTunnel) Ready() bool { return !t.sparse && t.n > 0 }

func (t *benchTunnel) NextPiece() ([]byte, error) {
	if t.n == 0 {
		return nil, io.EOF
	}
	if t.sparse && t.yielded > 0 { // the next line once the client read the last
		select {
		case <-t.read:
		case <-t.ctx.Done():
			return nil, context.Cause(t.ctx)
		}
	}
	t.n--
	t.yielded++
	if t.n == 0 {
		return []byte(benchDone), nil // a fresh piece, as a frame the Node sent
	}
	return []byte(benchLine), nil
}

// The Edge's side of one request, per request: an Ollama /api/chat from a
// real HTTP client over loopback (its connection kept alive), through the
// front end (authentication, the API's parsing, the plan) to StartTunnel,
// and a one-line answer back. The Node and QUIC are not in it: this is the
// Edge's own part of a first token (issue 25). The client's work is in the
// figure too; a profile tells the two apart.
//
//	go test -run '^$' -bench TunnelRequest -benchmem ./internal/edge/ollamaapi
func BenchmarkTunnelRequest(b *testing.B) {
	srv := httptest.NewServer(Handler(frontend.New(oneLineRunner{&ft.Dispatcher{}}, testAuth(b), frontend.Options{Metrics: edgemetrics.New(nil, nil)})))
	defer srv.Close()
	c := srv.Client()
	b.ReportAllocs()
	for b.Loop() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/chat", strings.NewReader(chatBody))
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || string(body) != benchDone {
			b.Fatalf("%s %q %v", resp.Status, body, err)
		}
	}
}

// oneLineRunner starts tunnels that answer the final line alone.
type oneLineRunner struct{ *ft.Dispatcher }

func (r oneLineRunner) StartTunnel(_ context.Context, _ *dispatch.Plan, _ *wirepb.TunnelRequest, body dispatch.TunnelBody, watch dispatch.Watch) (frontend.Tunnel, error) {
	if _, err := body("m1"); err != nil {
		return nil, err
	}
	if watch.Admitted != nil {
		watch.Admitted()
	}
	t := &benchTunnel{n: 1}
	t.ctx, t.cancel = context.WithCancelCause(context.Background())
	return t, nil
}
