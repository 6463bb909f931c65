package nodeserver_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"weak"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/internal/node/execution"
	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/plugins/ollama"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

func tHead(status int32) *wirepb.TunnelFrame {
	return &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Head{Head: &wirepb.TunnelResponseHead{
		Status: status, Headers: []*wirepb.Header{{Name: "Content-Type", Value: "application/x-ndjson"}},
	}}}
}

func tBody(b []byte) *wirepb.TunnelFrame {
	return &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: b}}
}

func tTerminal(o wirepb.TunnelOutcome) *wirepb.TunnelFrame {
	return &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Terminal{Terminal: &wirepb.TunnelTerminal{Outcome: o}}}
}

var tCompleted = tTerminal(wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED)

func tunnelRequest(id string) *wirepb.TunnelRequest {
	return &wirepb.TunnelRequest{TunnelId: id, Target: "sim-small", Method: "POST", Path: "/api/chat"}
}

// readBody reads a tunnel's request body on the Node: body frames until
// the Edge's FIN. It returns the bytes and each frame's size.
func readBody(st *transport.Stream) ([]byte, []int, error) {
	var body []byte
	var sizes []int
	for {
		f := new(wirepb.TunnelFrame)
		err := st.Recv(f)
		if err == io.EOF {
			return body, sizes, nil
		}
		if err != nil {
			return body, sizes, err
		}
		body = append(body, f.GetBody()...)
		sizes = append(sizes, len(f.GetBody()))
	}
}

// echoHandler answers every tunnel with its request body, in frames of at
// most chunk bytes, between a head and a COMPLETED terminal. It reports
// the request body's frame sizes.
func echoHandler(chunk int, sizes chan<- []int) handlerFunc {
	return func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
		body, s, err := readBody(st)
		sizes <- s
		if err != nil {
			return
		}
		st.Send(tHead(200))
		for len(body) > 0 {
			n := min(chunk, len(body))
			if st.Send(tBody(body[:n])) != nil {
				return
			}
			body = body[n:]
		}
		st.Send(tCompleted)
	}
}

// requireTunnelError checks that err is the terminal outcome want with
// failure kind kind (unspecified: any) and returns it.
func requireTunnelError(t *testing.T, err error, want wirepb.TunnelOutcome, kind wirepb.FailureKind) *nodeserver.TunnelError {
	t.Helper()
	var te *nodeserver.TunnelError
	if !errors.As(err, &te) || te.Outcome != want || kind != 0 && te.Failure.GetKind() != kind {
		t.Fatalf("got %v, want a %v %v terminal", err, want, kind)
	}
	return te
}

// echoBody is what the echo tunnels send: two NDJSON lines.
const echoBody = `{"line":1}` + "\n" + `{"line":2}` + "\n"

// startEchoTunnel starts an Edge and a Node whose handler answers a
// tunnel with its body in frames of 7 bytes, and opens a tunnel carrying
// body to it, closed at the test's end.
func startEchoTunnel(t *testing.T, h *harness, body string) *nodeserver.TunnelStream {
	t.Helper()
	e := h.startEdge(0)
	h.startNode("n1", withHandler(echoHandler(7, make(chan []int, 1))))
	h.waitReady("n1")
	ts, err := e.srv.Tunnel(t.Context(), "n1", tunnelRequest("t1"), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ts.Close)
	return ts
}

// echoFrames are the body frames the echo handler sends for body.
func echoFrames(body string) []string {
	var frames []string
	for rest := body; rest != ""; rest = rest[min(7, len(rest)):] {
		frames = append(frames, rest[:min(7, len(rest))])
	}
	return frames
}

// R3: the head, then the body as the Node sent it, frame by frame (each
// Read hands out one frame: nothing waits for a buffer to fill), then
// io.EOF at the COMPLETED terminal.
func TestTunnelRelaysHeadAndBodyInOrderThenEOF(t *testing.T) {
	forEachNetwork(t, func(t *testing.T, h *harness) {
		ts := startEchoTunnel(t, h, echoBody)
		head, err := ts.Head()
		if err != nil || head.GetStatus() != 200 || head.GetHeaders()[0].GetValue() != "application/x-ndjson" {
			t.Fatalf("head %v, %v", head, err)
		}
		var reads []string
		buf := make([]byte, 1024)
		for {
			n, err := ts.Read(buf)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			reads = append(reads, string(buf[:n]))
		}
		want := echoFrames(echoBody)
		if len(reads) != len(want) {
			t.Fatalf("reads %q, want %q", reads, want)
		}
		for i := range want {
			if reads[i] != want[i] {
				t.Fatalf("reads %q, want %q", reads, want)
			}
		}
		if term := ts.Terminal(); term.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED {
			t.Errorf("terminal %v", term)
		}
		if n, err := ts.Read(buf); n != 0 || err != io.EOF {
			t.Errorf("read after the end: %d %v", n, err)
		}
		if ts.Generation() == 0 {
			t.Error("no generation")
		}
	})
}

// Issue 25: NextPiece hands out each body frame whole, as the Node sent
// it, and each piece stays the caller's: the pieces kept until the end are
// still the frames (nothing reuses their bytes); then io.EOF, as Read.
func TestTunnelNextPieceHandsOutWholeFramesToKeep(t *testing.T) {
	forEachNetwork(t, func(t *testing.T, h *harness) {
		ts := startEchoTunnel(t, h, echoBody)
		var pieces [][]byte
		for {
			p, err := ts.NextPiece()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("next piece: %v", err)
			}
			pieces = append(pieces, p)
		}
		want := echoFrames(echoBody)
		if len(pieces) != len(want) {
			t.Fatalf("pieces %q, want %q", pieces, want)
		}
		for i := range want {
			if string(pieces[i]) != want[i] {
				t.Fatalf("pieces %q, want %q", pieces, want)
			}
		}
		if p, err := ts.NextPiece(); len(p) != 0 || err != io.EOF {
			t.Errorf("next piece after the end: %q %v", p, err)
		}
	})
}

// Ready says what Read returns without waiting: a body frame that came
// with the head is ready, but not the terminal after the last one, for
// which Read waits until the Node finishes its half (a relay flushes the
// answer's last line rather than hold it for that FIN).
func TestTunnelReadyBeforeTheTerminalIsFalse(t *testing.T) {
	forEachNetwork(t, func(t *testing.T, h *harness) {
		e := h.startEdge(0)
		finish := make(chan struct{})
		h.startNode("n1", withHandler(handlerFunc(func(_ context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
			if _, _, err := readBody(st); err != nil {
				return
			}
			st.SendFrames(tHead(200), tBody([]byte("last\n")), tCompleted) // one write: they arrive together
			<-finish                                                       // then the FIN, when the test says
		})))
		h.waitReady("n1")
		ts, err := e.srv.Tunnel(t.Context(), "n1", tunnelRequest("t1"), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ts.Close()
		if _, err := ts.Head(); err != nil {
			t.Fatal(err)
		}
		if !ts.Ready() {
			t.Fatal("the body frame that came with the head is not ready")
		}
		buf := make([]byte, 64)
		if n, err := ts.Read(buf); err != nil || string(buf[:n]) != "last\n" {
			t.Fatalf("read %q, %v", buf[:n], err)
		}
		if ts.Ready() {
			t.Error("ready with only the terminal next: Read would wait for the FIN")
		}
		close(finish)
		if n, err := ts.Read(buf); n != 0 || err != io.EOF {
			t.Fatalf("read after the terminal: %d %v, want io.EOF", n, err)
		}
	})
}

// R3: a 1 MiB request body crosses in chunks of at most MaxBodyChunkSize,
// and comes back whole and in order.
func TestTunnelSendsAMebibyteInBoundedChunks(t *testing.T) {
	forEachNetwork(t, func(t *testing.T, h *harness) {
		e := h.startEdge(0)
		sizes := make(chan []int, 1)
		h.startNode("n1", withHandler(echoHandler(quicwire.MaxBodyChunkSize, sizes)))
		h.waitReady("n1")
		body := make([]byte, 1<<20)
		for i := range body {
			body[i] = byte(rand.Uint32())
		}
		ts, err := e.srv.Tunnel(t.Context(), "n1", tunnelRequest("big"), bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer ts.Close()
		got, err := io.ReadAll(ts)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("echoed %d bytes (equal: %v), %v", len(got), bytes.Equal(got, body), err)
		}
		s := <-sizes
		total := 0
		for _, n := range s {
			if n > quicwire.MaxBodyChunkSize || n == 0 {
				t.Fatalf("a request body frame of %d bytes (limit %d)", n, quicwire.MaxBodyChunkSize)
			}
			total += n
		}
		if total != len(body) || len(s) < len(body)/quicwire.MaxBodyChunkSize {
			t.Fatalf("%d bytes in %d frames", total, len(s))
		}
	})
}

// R9: a tunnel whose Node generation is fenced in the middle of both
// bodies ends with exactly one DISCONNECTED terminal.
func TestTunnelOnAFencedGenerationEndsDisconnected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		n := h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
			st.Send(tHead(200))
			st.Send(tBody([]byte("first")))
			<-ctx.Done()
		})))
		conn := h.waitReady("n1")
		pr, pw := io.Pipe()
		defer pw.Close() // unblocks the body sender
		go pw.Write([]byte("part of the request"))
		ts, err := e.srv.Tunnel(t.Context(), "n1", tunnelRequest("t1"), pr)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		if n, err := ts.Read(buf); err != nil || string(buf[:n]) != "first" {
			t.Fatalf("first read: %q %v", buf[:n], err)
		}
		n.faults.SilenceHeartbeatAcks.Store(true)
		<-conn.Fenced()
		_, err = ts.Read(buf)
		te := requireTunnelError(t, err, wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED, wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE)
		if !errors.Is(err, quicwire.ErrDisconnected) || !te.Failure.GetRetryable() {
			t.Errorf("%v: want errors.Is ErrDisconnected and retryable", err)
		}
		if _, again := ts.Read(buf); again != err || ts.Terminal().GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED {
			t.Errorf("after the terminal: %v, terminal %v", again, ts.Terminal())
		}
	})
}

// R10: cancelling the tunnel's context after the request body (the Edge
// then sends nothing more) reaches the Node during the provider's silence,
// and yields one CANCELLED terminal.
func TestTunnelCancelReachesTheNodeAfterTheBody(t *testing.T) {
	forEachNetwork(t, func(t *testing.T, h *harness) {
		e := h.startEdge(0)
		sawCancel := make(chan error, 1)
		h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
			if _, _, err := readBody(st); err != nil {
				sawCancel <- err
				return
			}
			st.Send(tHead(200))
			// A silent prefill: the Edge's cancel stops its reading, which
			// ends this stream's write side.
			select {
			case <-st.Raw().Context().Done():
				sawCancel <- context.Cause(st.Raw().Context())
			case <-ctx.Done():
				sawCancel <- ctx.Err()
			}
		})))
		h.waitReady("n1")
		ctx, cancel := context.WithCancel(t.Context())
		ts, err := e.srv.Tunnel(ctx, "n1", tunnelRequest("t1"), bytes.NewReader([]byte("req")))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ts.Head(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		cancel()
		select {
		case err := <-sawCancel:
			var se *quic.StreamError
			if !errors.As(err, &se) || quicwire.StreamCode(se.ErrorCode) != quicwire.StreamCancelled || !se.Remote {
				t.Errorf("node saw %v, want the stream cancelled by the edge", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the cancel never reached the silent node")
		}
		_, err = ts.Read(make([]byte, 8))
		requireTunnelError(t, err, wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED, 0)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%v: want errors.Is context.Canceled", err)
		}
	})
}

// errBody is a request body that breaks after its first chunk, once the
// Node has that chunk.
type errBody struct {
	n         int
	delivered chan struct{}
}

var errBodyBroke = errors.New("client went away mid-upload")

func (b *errBody) Read(p []byte) (int, error) {
	if b.n++; b.n == 1 {
		return copy(p, "chunk"), nil
	}
	<-b.delivered
	return 0, errBodyBroke
}

// A request body that fails to read cancels the tunnel, on the Node too.
func TestTunnelBodyReadErrorCancelsTheTunnel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		sawCancel, delivered := make(chan error, 1), make(chan struct{})
		h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
			if err := st.Recv(new(wirepb.TunnelFrame)); err != nil {
				sawCancel <- err
				return
			}
			close(delivered)
			_, _, err := readBody(st)
			sawCancel <- err
		})))
		h.waitReady("n1")
		ts, err := e.srv.Tunnel(t.Context(), "n1", tunnelRequest("t1"), &errBody{delivered: delivered})
		if err != nil {
			t.Fatal(err)
		}
		_, err = ts.Head()
		requireTunnelError(t, err, wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED, wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST)
		if !errors.Is(err, errBodyBroke) {
			t.Errorf("%v: want errors.Is the body's error", err)
		}
		var sc *quicwire.StreamCancelledError
		if err := <-sawCancel; !errors.As(err, &sc) || sc.Code != quicwire.StreamCancelled {
			t.Errorf("node saw %v, want the stream cancelled", err)
		}
	})
}

// R3: frames out of order, a stream without a terminal, or anything after
// the terminal are a protocol failure, made by the Edge as the one terminal.
func TestTunnelFramesOutOfOrderAreAProtocolFailure(t *testing.T) {
	cases := []struct {
		name   string
		frames []*wirepb.TunnelFrame
		body   string // read before the failure
	}{
		{"body before head", []*wirepb.TunnelFrame{tBody([]byte("x")), tCompleted}, ""},
		{"head twice", []*wirepb.TunnelFrame{tHead(200), tBody([]byte("x")), tHead(200), tCompleted}, "x"},
		{"frame after the terminal", []*wirepb.TunnelFrame{tHead(200), tBody([]byte("x")), tCompleted, tBody([]byte("y"))}, "x"},
		{"completed without a head", []*wirepb.TunnelFrame{tCompleted}, ""},
		{"no terminal", []*wirepb.TunnelFrame{tHead(200), tBody([]byte("x"))}, "x"},
		{"empty frame", []*wirepb.TunnelFrame{tHead(200), {}}, ""},
	}
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		script := make(chan []*wirepb.TunnelFrame, 1)
		h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
			readBody(st)
			for _, f := range <-script {
				st.Send(f)
			}
		})))
		h.waitReady("n1")
		for _, c := range cases {
			script <- c.frames
			ts, err := e.srv.Tunnel(t.Context(), "n1", tunnelRequest(c.name), nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(ts)
			te := requireTunnelError(t, err, wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, wirepb.FailureKind_FAILURE_KIND_PROTOCOL)
			if string(got) != c.body || ts.Terminal().GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_PROTOCOL {
				t.Errorf("%s: read %q then %v; terminal %v", c.name, got, te, ts.Terminal())
			}
			ts.Close()
		}
	})
}

// The Node's own FAILED terminal before the head is what Head returns, at
// once, even while a large request body is still going out.
func TestTunnelNodeFailureBeforeTheHeadEndsItAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
			st.Send(&wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Terminal{Terminal: &wirepb.TunnelTerminal{
				Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED,
				Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED, Message: "all 1 slots busy"},
			}}})
		})))
		h.waitReady("n1")
		// A large body the Node never reads: the tunnel still ends at once.
		ts, err := e.srv.Tunnel(t.Context(), "n1", tunnelRequest("t1"), bytes.NewReader(make([]byte, 4<<20)))
		if err != nil {
			t.Fatal(err)
		}
		_, err = ts.Head()
		te := requireTunnelError(t, err, wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED)
		if te.Err != nil || ts.Terminal().GetFailure().GetMessage() != "all 1 slots busy" {
			t.Errorf("%v (local cause %v); terminal %v", te, te.Err, ts.Terminal())
		}
	})
}

// P3, issue 25: a tunnel waiting for its head holds none of its request.
// The request (its headers, its sealed lease) went out with the stream's
// header; a waiting tunnel keeps only what its end is observed under, so
// that ten thousand waiting tunnels are not ten thousand requests. The
// tunnel still completes as before once the Node answers.
func TestTunnelWaitingForItsHeadHoldsNoRequest(t *testing.T) {
	h := newUDPHarness(t)
	e := h.startEdge(0)
	answer := make(chan struct{})
	h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
		if _, _, err := readBody(st); err != nil {
			return
		}
		select {
		case <-answer:
		case <-ctx.Done():
			return
		}
		st.Send(tHead(200))
		st.Send(tBody([]byte(echoBody)))
		st.Send(tCompleted)
	})))
	h.waitReady("n1")
	ts, held := openWatched(t, e, "n1")
	for i := 0; held() && i < 10; i++ {
		runtime.GC()
	}
	if held() {
		t.Fatal("a tunnel waiting for its head still holds its request")
	}
	close(answer)
	if head, err := ts.Head(); err != nil || head.GetStatus() != 200 {
		t.Fatalf("head %v, %v", head, err)
	}
	body, err := io.ReadAll(ts)
	if err != nil || string(body) != echoBody {
		t.Fatalf("body %q, %v", body, err)
	}
	if term := ts.Terminal(); term.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED {
		t.Errorf("terminal %v", term)
	}
}

// openWatched opens a tunnel to node whose request carries a sealed lease,
// and returns it with a report of whether anything still holds the
// request.
func openWatched(t *testing.T, e *edgeInstance, node string) (*nodeserver.TunnelStream, func() bool) {
	t.Helper()
	req := tunnelRequest("t1")
	req.SealedLease = make([]byte, 512)
	w := weak.Make(req)
	ts, err := e.srv.Tunnel(t.Context(), node, req, strings.NewReader(`{"model":"sim-small"}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ts.Close)
	return ts, func() bool { return w.Value() != nil }
}

// R3 backpressure: an Edge that reads nothing stops the Node's writes once
// the stream's window is full (nothing buffers without bound); when the
// Edge drains, everything arrives.
func TestTunnelSlowReaderSlowsTheNode(t *testing.T) {
	const total = 50 << 20
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t)
		e := h.startEdge(0)
		var written atomic.Int64
		done := make(chan struct{})
		h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, _ *transport.Session, _ *wirepb.StreamHeader, st *transport.Stream) {
			defer close(done)
			chunk := make([]byte, quicwire.MaxBodyChunkSize)
			st.Send(tHead(200))
			for written.Load() < total {
				if st.Send(tBody(chunk)) != nil {
					return
				}
				written.Add(int64(len(chunk)))
			}
			st.Send(tCompleted)
		})))
		h.waitReady("n1")
		ts, err := e.srv.Tunnel(t.Context(), "n1", tunnelRequest("slow"), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ts.Close()
		if _, err := ts.Head(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Minute)
		select {
		case <-done:
			t.Fatal("the node wrote 50 MiB to an Edge that read nothing")
		default:
		}
		if w := written.Load(); w > 2*quicwire.StreamWindow {
			t.Fatalf("the node wrote %d bytes ahead of a reader that read nothing (stream window %d)", w, quicwire.StreamWindow)
		}
		t.Logf("after 10 min without a read, the node has written %d KiB of %d MiB", written.Load()>>10, total>>20)
		n, err := io.Copy(io.Discard, ts)
		if err != nil || n != total {
			t.Fatalf("drained %d bytes, %v", n, err)
		}
		<-done
	})
}

// R3 and R10 through the whole Node, on real UDP: the Edge's tunnel, the
// Node's runtime, the real Ollama adapter over the plugin protocol, the
// fake Ollama. A streaming /api/chat reaches the Edge line by line, as the
// provider flushed it; a cancel during a silent prefill reaches the
// provider.
func TestTunnelThroughTheNodeRuntimeToOllama(t *testing.T) {
	const lines, delay = 6, 50 * time.Millisecond
	fake := fakeollama.New(fakeollama.Model{Name: "m:latest", TokenCount: lines, TokenDelay: delay},
		fakeollama.Model{Name: "slow:latest", PrefillDelay: time.Hour})
	t.Cleanup(fake.Close)
	set := execution.NewSet()
	set.Add(execution.NewProvider(execution.ProviderConfig{Name: "o", Adapter: "ollama", Targets: []string{"m", "slow"}, Capacity: 2,
		Config: sdk.MustConfig(map[string]any{"base_url": fake.URL()}),
		Launch: func(ctx context.Context) (execution.Plugin, error) {
			return pluginhost.StartInProcess(ctx, ollama.New())
		},
	}, execution.DefaultSupervision, slog.New(slog.DiscardHandler), set.Notify))
	set.Start()
	t.Cleanup(set.Stop)
	if err := set.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	h := newUDPHarness(t)
	e := h.startEdge(0)
	h.startNode("n1", withHandler(execution.NewHandler(set, slog.New(slog.DiscardHandler), execution.HandlerOptions{})))
	h.waitReady("n1")
	chat := func(ctx context.Context, model string) *nodeserver.TunnelStream {
		req := &wirepb.TunnelRequest{TunnelId: model, Target: model, Method: "POST", Path: "/api/chat",
			Headers: []*wirepb.Header{{Name: "Content-Type", Value: "application/json"}}}
		ts, err := e.srv.Tunnel(ctx, "n1", req, strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ts.Close)
		return ts
	}

	// The Node also reads the fake's /api/ps (what it has loaded, issue
	// 23): only the chats are the tunnels'.
	chats := func() []fakeollama.Request {
		var out []fakeollama.Request
		for _, r := range fake.Requests() {
			if r.Path == "/api/chat" {
				out = append(out, r)
			}
		}
		return out
	}

	ts := chat(t.Context(), "m")
	if head, err := ts.Head(); err != nil || head.GetStatus() != 200 {
		t.Fatalf("head %v, %v", head, err)
	}
	var got []byte
	var at []time.Time
	buf := make([]byte, quicwire.MaxBodyChunkSize)
	for {
		n, err := ts.Read(buf)
		if err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasSuffix(buf[:n], []byte("\n")) {
			t.Errorf("read %q does not end a line", buf[:n])
		}
		got, at = append(got, buf[:n]...), append(at, time.Now())
	}
	if sent := chats()[0].Response; !bytes.Equal(got, sent) {
		t.Fatalf("relayed %q\nprovider sent %q", got, sent)
	}
	if len(at) < lines || at[len(at)-1].Sub(at[0]) < (lines-1)*delay/2 {
		t.Fatalf("%d reads over %v: the answer was buffered, not relayed as flushed", len(at), at[len(at)-1].Sub(at[0]))
	}

	ctx, cancel := context.WithCancel(t.Context())
	ts = chat(ctx, "slow")
	h.waitFor("the provider has the request", 5*time.Second, func() bool { return len(chats()) == 2 })
	cancelled := time.Now()
	cancel()
	_, err := ts.Head()
	requireTunnelError(t, err, wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED, 0)
	h.waitFor("the provider sees its client go away", 5*time.Second, func() bool { return chats()[1].Gone() })
	t.Logf("the cancel reached the provider in %v", chats()[1].GoneAt.Sub(cancelled))
}
