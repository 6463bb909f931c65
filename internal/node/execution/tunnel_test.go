package execution

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// fakeTunnelStream is an in-memory tunnel stream. The Edge's frames come
// from in (closed: the Edge's FIN); what the Node sends is recorded, and
// after cancel() (the Edge's reset) refused sends are recorded apart.
type fakeTunnelStream struct {
	in        chan *wirepb.TunnelFrame
	ctx       context.Context // the write side: ends at cancel()
	cancelCtx context.CancelCauseFunc
	cancelled chan struct{}
	once      sync.Once

	mu      sync.Mutex
	sent    []*wirepb.TunnelFrame
	refused []*wirepb.TunnelFrame
	writes  []int // frames sent in each write (Send: 1; SendFrames: all of them)
}

// newFakeTunnelStream returns a stream on which the Edge has sent body,
// one frame per chunk, and then FIN if fin.
func newFakeTunnelStream(fin bool, body ...string) *fakeTunnelStream {
	ctx, cancel := context.WithCancelCause(context.Background())
	f := &fakeTunnelStream{in: make(chan *wirepb.TunnelFrame, len(body)+1), ctx: ctx, cancelCtx: cancel, cancelled: make(chan struct{})}
	for _, b := range body {
		f.in <- bodyFrame(b)
	}
	if fin {
		close(f.in)
	}
	return f
}

func (f *fakeTunnelStream) Send(m proto.Message) error { return f.SendFrames(m) }

// SendFrames records ms as one write, as transport.Stream's.
func (f *fakeTunnelStream) SendFrames(ms ...proto.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	frs := make([]*wirepb.TunnelFrame, len(ms))
	for i, m := range ms {
		frs[i] = proto.Clone(m).(*wirepb.TunnelFrame)
	}
	select {
	case <-f.cancelled:
		f.refused = append(f.refused, frs...)
		return &quicwire.StreamCancelledError{Code: quicwire.StreamCancelled, Remote: true}
	default:
	}
	f.sent = append(f.sent, frs...)
	f.writes = append(f.writes, len(frs))
	return nil
}

// writeSizes is how many frames each write carried, in order.
func (f *fakeTunnelStream) writeSizes() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.writes)
}

func (f *fakeTunnelStream) Recv(m proto.Message) error {
	reset := &quicwire.StreamCancelledError{Code: quicwire.StreamCancelled, Remote: true}
	select {
	case <-f.cancelled:
		return reset
	default:
	}
	select {
	case fr, ok := <-f.in:
		if !ok {
			return io.EOF
		}
		proto.Merge(m, fr)
		return nil
	case <-f.cancelled:
		return reset
	}
}

// Context ends when the Edge cancels, like a QUIC stream's write side on
// STOP_SENDING (whose cause is then the peer's stream error).
func (f *fakeTunnelStream) Context() context.Context { return f.ctx }

func (f *fakeTunnelStream) cancel() {
	f.once.Do(func() {
		close(f.cancelled)
		f.cancelCtx(&quicwire.StreamCancelledError{Code: quicwire.StreamCancelled, Remote: true})
	})
}

func (f *fakeTunnelStream) frames() (sent, refused []*wirepb.TunnelFrame) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sent), slices.Clone(f.refused)
}

func bodyFrame(b string) *wirepb.TunnelFrame {
	return &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: []byte(b)}}
}

func headFrame(status int32) *wirepb.TunnelFrame {
	return &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Head{Head: &wirepb.TunnelResponseHead{Status: status}}}
}

func terminalFrame(t *wirepb.TunnelTerminal) *wirepb.TunnelFrame {
	return &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Terminal{Terminal: t}}
}

var completed = &wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED}

// tunnelPlugin is a fake plugin that relays tunnels with fn.
type tunnelPlugin struct {
	*fakePlugin
	caps  []string
	fn    func(ctx context.Context, req *wirepb.TunnelRequest, body io.Reader, emit func(*wirepb.TunnelFrame) error) error
	calls atomic.Int32
}

func newTunnelPlugin(fn func(ctx context.Context, req *wirepb.TunnelRequest, body io.Reader, emit func(*wirepb.TunnelFrame) error) error) *tunnelPlugin {
	return &tunnelPlugin{fakePlugin: newFakePlugin(nil), caps: []string{sdk.CapTunnel}, fn: fn}
}

func (p *tunnelPlugin) Capabilities() []string { return p.caps }
func (p *tunnelPlugin) Tunnel(ctx context.Context, req *wirepb.TunnelRequest, _ *sdk.Credential, body io.Reader, emit func(*wirepb.TunnelFrame) error) error {
	p.calls.Add(1)
	return p.fn(ctx, req, body, emit)
}

// echo answers with the request body, cut into frames of at most 3 bytes.
func echo(_ context.Context, _ *wirepb.TunnelRequest, body io.Reader, emit func(*wirepb.TunnelFrame) error) error {
	b, err := io.ReadAll(body)
	if err != nil {
		return err
	}
	if err := emit(headFrame(200)); err != nil {
		return err
	}
	for len(b) > 0 {
		n := min(3, len(b))
		if err := emit(bodyFrame(string(b[:n]))); err != nil {
			return err
		}
		b = b[n:]
	}
	return emit(terminalFrame(completed))
}

func tunnelReq(id string) *wirepb.TunnelRequest {
	return &wirepb.TunnelRequest{TunnelId: id, Target: "m", Method: "POST", Path: "/api/chat"}
}

// serveTunnelOn serves one tunnel the way the transport does: the stream's
// reading half is finished after the handler returns.
func serveTunnelOn(h *Handler, ctx context.Context, req *wirepb.TunnelRequest, st *fakeTunnelStream) {
	defer st.cancel()
	h.serveTunnel(ctx, nil, req, st)
}

// requireTunnelOrder checks head, body..., then exactly one terminal, and
// returns the head (nil if none), the body and the terminal.
func requireTunnelOrder(t *testing.T, frames []*wirepb.TunnelFrame) (*wirepb.TunnelResponseHead, []byte, *wirepb.TunnelTerminal) {
	t.Helper()
	if len(frames) == 0 {
		t.Fatal("no frames")
	}
	var head *wirepb.TunnelResponseHead
	var body []byte
	for i, f := range frames {
		last := i == len(frames)-1
		switch fr := f.GetFrame().(type) {
		case *wirepb.TunnelFrame_Head:
			if i != 0 {
				t.Fatalf("head at %d: %v", i, frames)
			}
			head = fr.Head
		case *wirepb.TunnelFrame_Body:
			if head == nil {
				t.Fatalf("body before the head: %v", frames)
			}
			body = append(body, fr.Body...)
		case *wirepb.TunnelFrame_Terminal:
			if !last {
				t.Fatalf("terminal at %d of %d: %v", i, len(frames), frames)
			}
			return head, body, fr.Terminal
		}
	}
	t.Fatalf("no terminal: %v", frames)
	return nil, nil, nil
}

// R3: the response head, the body in order, then exactly one terminal:
// the plugin's, passed through.
func TestTunnelRelaysHeadBodyInOrderAndOneTerminal(t *testing.T) {
	pl := newTunnelPlugin(echo)
	_, h := onlineSet(t, 1, pl)
	st := newFakeTunnelStream(true, "hello, ", "tunnel", " world")
	serveTunnelOn(h, t.Context(), tunnelReq("t1"), st)
	sent, _ := st.frames()
	head, body, term := requireTunnelOrder(t, sent)
	if head.GetStatus() != 200 || string(body) != "hello, tunnel world" || term.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED {
		t.Errorf("head %v body %q terminal %v", head, body, term)
	}
	if len(sent) != 2+len(body)/3+1 {
		t.Errorf("%d frames: the plugin's frames were merged or split", len(sent))
	}
}

// The plugin's FAILED terminal (an upstream failure after the head) passes
// through once; a frame it tries to send after it is refused.
func TestTunnelPluginTerminalPassesThroughOnce(t *testing.T) {
	var late error
	pl := newTunnelPlugin(func(_ context.Context, _ *wirepb.TunnelRequest, _ io.Reader, emit func(*wirepb.TunnelFrame) error) error {
		emit(headFrame(200))
		emit(bodyFrame(`{"a":1}` + "\n"))
		emit(terminalFrame(&wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_UPSTREAM, Message: "broke off"}}))
		late = emit(bodyFrame("late"))
		return nil
	})
	_, h := onlineSet(t, 1, pl)
	st := newFakeTunnelStream(true)
	serveTunnelOn(h, t.Context(), tunnelReq("t1"), st)
	sent, _ := st.frames()
	_, _, term := requireTunnelOrder(t, sent)
	if term.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_UPSTREAM || term.GetFailure().GetMessage() != "broke off" {
		t.Errorf("terminal = %v, want the plugin's", term)
	}
	if late == nil {
		t.Error("a frame after the terminal was accepted")
	}
}

// A plugin call that ends without a terminal gets the Node's: FAILED with
// the error's kind, or a protocol failure for frames out of order.
func TestTunnelPluginErrorGetsTheNodesTerminal(t *testing.T) {
	for _, c := range []struct {
		name string
		fn   func(emit func(*wirepb.TunnelFrame) error) error
		want wirepb.FailureKind
	}{
		{"unavailable", func(func(*wirepb.TunnelFrame) error) error {
			return sdk.Errorf(sdk.KindUnavailable, "connection refused")
		}, wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE},
		{"plugin exited", func(emit func(*wirepb.TunnelFrame) error) error {
			emit(headFrame(200))
			return pluginhost.ErrPluginExited
		}, wirepb.FailureKind_FAILURE_KIND_INTERNAL},
		{"no terminal", func(emit func(*wirepb.TunnelFrame) error) error {
			return emit(headFrame(200))
		}, wirepb.FailureKind_FAILURE_KIND_INTERNAL},
		{"body before head", func(emit func(*wirepb.TunnelFrame) error) error {
			return emit(bodyFrame("x"))
		}, wirepb.FailureKind_FAILURE_KIND_PROTOCOL},
		{"two heads", func(emit func(*wirepb.TunnelFrame) error) error {
			emit(headFrame(200))
			return emit(headFrame(200))
		}, wirepb.FailureKind_FAILURE_KIND_PROTOCOL},
		{"plugin claims a node outcome", func(emit func(*wirepb.TunnelFrame) error) error {
			return emit(terminalFrame(&wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED}))
		}, wirepb.FailureKind_FAILURE_KIND_PROTOCOL},
	} {
		t.Run(c.name, func(t *testing.T) {
			pl := newTunnelPlugin(func(_ context.Context, _ *wirepb.TunnelRequest, _ io.Reader, emit func(*wirepb.TunnelFrame) error) error {
				return c.fn(emit)
			})
			_, h := onlineSet(t, 1, pl)
			st := newFakeTunnelStream(true)
			serveTunnelOn(h, t.Context(), tunnelReq("t1"), st)
			sent, _ := st.frames()
			_, _, term := requireTunnelOrder(t, sent)
			if term.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED || term.GetFailure().GetKind() != c.want {
				t.Errorf("terminal = %v, want FAILED %v", term, c.want)
			}
		})
	}
}

// Refusals come before the plugin is called, each with its own kind: an
// invalid stall timeout (R4), an unknown target, no tunnel capability.
func TestTunnelRefusalsNeverReachThePlugin(t *testing.T) {
	for _, c := range []struct {
		name string
		caps []string
		req  func(*wirepb.TunnelRequest)
		want wirepb.FailureKind
	}{
		{"negative stall timeout", []string{sdk.CapTunnel}, func(r *wirepb.TunnelRequest) { r.ResponseStallTimeoutMs = -1 }, wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST},
		{"stall timeout over an hour", []string{sdk.CapTunnel}, func(r *wirepb.TunnelRequest) { r.ResponseStallTimeoutMs = MaxStallTimeoutMillis + 1 }, wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST},
		{"unknown target", []string{sdk.CapTunnel}, func(r *wirepb.TunnelRequest) { r.Target = "nope" }, wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND},
		{"unknown provider", []string{sdk.CapTunnel}, func(r *wirepb.TunnelRequest) { r.Provider = "nope" }, wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND},
		{"no tunnel capability", []string{sdk.CapListTargets}, func(*wirepb.TunnelRequest) {}, wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED},
	} {
		t.Run(c.name, func(t *testing.T) {
			pl := newTunnelPlugin(echo)
			pl.caps = c.caps
			_, h := onlineSet(t, 1, pl)
			st := newFakeTunnelStream(true, "body")
			req := tunnelReq("t1")
			c.req(req)
			serveTunnelOn(h, t.Context(), req, st)
			sent, _ := st.frames()
			if _, _, term := requireTunnelOrder(t, sent); term.GetFailure().GetKind() != c.want {
				t.Errorf("terminal = %v, want %v", term, c.want)
			}
			if pl.calls.Load() != 0 {
				t.Error("the plugin was called")
			}
		})
	}
}

// A tunnel takes a capacity slot like a run: over capacity it is refused
// at once, and the slot is free again when the tunnel ends.
func TestTunnelOverCapacityIsRefusedAtOnce(t *testing.T) {
	started, finish := make(chan struct{}, 2), make(chan struct{})
	pl := newTunnelPlugin(func(ctx context.Context, req *wirepb.TunnelRequest, body io.Reader, emit func(*wirepb.TunnelFrame) error) error {
		if req.GetTunnelId() == "busy" {
			started <- struct{}{}
			<-finish
		}
		return echo(ctx, req, body, emit)
	})
	_, h := onlineSet(t, 1, pl)
	done := make(chan struct{})
	go func() { serveTunnelOn(h, t.Context(), tunnelReq("busy"), newFakeTunnelStream(true)); close(done) }()
	<-started
	st := newFakeTunnelStream(true)
	serveTunnelOn(h, t.Context(), tunnelReq("over"), st)
	sent, _ := st.frames()
	if _, _, term := requireTunnelOrder(t, sent); term.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED {
		t.Errorf("over capacity: %v", term)
	}
	close(finish)
	<-done
	st = newFakeTunnelStream(true, "again")
	serveTunnelOn(h, t.Context(), tunnelReq("after"), st)
	sent, _ = st.frames()
	if _, body, term := requireTunnelOrder(t, sent); term.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED || string(body) != "again" {
		t.Errorf("tunnel after the slot freed: %v %q", term, body)
	}
}

// R10: the Edge's cancel in the middle of the request body cancels the
// plugin's context and the body read; the Node claims one CANCELLED
// terminal (which the reset stream no longer carries).
func TestTunnelCancelMidBodyCancelsThePlugin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gotFirst := make(chan struct{})
		var bodyErr, ctxErr error
		pl := newTunnelPlugin(func(ctx context.Context, _ *wirepb.TunnelRequest, body io.Reader, _ func(*wirepb.TunnelFrame) error) error {
			buf := make([]byte, 64)
			if n, err := body.Read(buf); err != nil || string(buf[:n]) != "first" {
				return errors.New("first chunk: " + string(buf[:n]))
			}
			close(gotFirst)
			_, bodyErr = io.ReadAll(body)
			<-ctx.Done()
			ctxErr = ctx.Err()
			return ctxErr
		})
		_, h := onlineSet(t, 1, pl)
		st := newFakeTunnelStream(false, "first") // no FIN: the body is still coming
		go func() { <-gotFirst; time.Sleep(time.Second); st.cancel() }()
		serveTunnelOn(h, t.Context(), tunnelReq("c"), st)
		var sc *quicwire.StreamCancelledError
		if !errors.As(bodyErr, &sc) || ctxErr == nil {
			t.Errorf("body read ended with %v, plugin context with %v; want the reset and a cancelled context", bodyErr, ctxErr)
		}
		sent, refused := st.frames()
		if len(sent) != 0 {
			t.Errorf("sent %v before the cancel", sent)
		}
		if len(refused) != 1 || refused[0].GetTerminal().GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED {
			t.Errorf("terminal claims after the cancel: %v, want one CANCELLED", refused)
		}
	})
}

// R10: after the request body the Edge sends nothing, yet its cancel still
// reaches a plugin waiting on a silent provider, at once.
func TestTunnelCancelAfterTheBodyReachesASilentProvider(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pl := newTunnelPlugin(func(ctx context.Context, _ *wirepb.TunnelRequest, body io.Reader, emit func(*wirepb.TunnelFrame) error) error {
			if _, err := io.ReadAll(body); err != nil {
				return err
			}
			emit(headFrame(200))
			<-ctx.Done() // a long prefill
			return ctx.Err()
		})
		_, h := onlineSet(t, 1, pl)
		st := newFakeTunnelStream(true, "req")
		var cancelledAt time.Time
		go func() {
			time.Sleep(time.Minute)
			cancelledAt = time.Now()
			st.cancel()
		}()
		serveTunnelOn(h, t.Context(), tunnelReq("c"), st)
		if took := time.Since(cancelledAt); took != 0 {
			t.Errorf("the plugin returned %v after the cancel", took)
		}
		sent, refused := st.frames()
		if len(sent) != 1 || sent[0].GetHead() == nil {
			t.Errorf("sent %v", sent)
		}
		if len(refused) != 1 || refused[0].GetTerminal().GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED {
			t.Errorf("terminal claims after the cancel: %v, want one CANCELLED", refused)
		}
	})
}

// The hard deadline and the connection's end each give their own terminal.
func TestTunnelDeadlineAndDisconnectTerminals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pl := newTunnelPlugin(func(ctx context.Context, _ *wirepb.TunnelRequest, _ io.Reader, emit func(*wirepb.TunnelFrame) error) error {
			emit(headFrame(200))
			<-ctx.Done()
			return ctx.Err()
		})
		_, h := onlineSet(t, 1, pl)

		st := newFakeTunnelStream(true)
		req := tunnelReq("d")
		req.DeadlineUnixMs = time.Now().Add(2 * time.Second).UnixMilli()
		serveTunnelOn(h, t.Context(), req, st)
		sent, _ := st.frames()
		if _, _, term := requireTunnelOrder(t, sent); term.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_DEADLINE_EXCEEDED {
			t.Errorf("deadline: %v", term)
		}

		conn, lost := context.WithCancel(t.Context())
		time.AfterFunc(time.Second, lost)
		st = newFakeTunnelStream(true)
		serveTunnelOn(h, conn, tunnelReq("x"), st)
		sent, _ = st.frames()
		if _, _, term := requireTunnelOrder(t, sent); term.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED {
			t.Errorf("connection lost: %v", term)
		}
	})
}

// The Edge may send only body chunks: anything else ends the tunnel with a
// protocol failure.
func TestTunnelEdgeSendingAHeadIsAProtocolFailure(t *testing.T) {
	pl := newTunnelPlugin(echo)
	_, h := onlineSet(t, 1, pl)
	st := newFakeTunnelStream(false, "a")
	st.in <- headFrame(200)
	serveTunnelOn(h, t.Context(), tunnelReq("p"), st)
	sent, _ := st.frames()
	if _, _, term := requireTunnelOrder(t, sent); term.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_PROTOCOL {
		t.Errorf("terminal = %v, want a protocol failure", term)
	}
}

// A metadata tunnel (Ollama's /api/tags and the like) takes no capacity
// slot: it answers while every slot is busy.
func TestMetadataTunnelTakesNoSlot(t *testing.T) {
	busy := make(chan struct{})
	pl := newFakePlugin(func(ctx context.Context, _ *wirepb.RunRequest, _ func(*wirepb.RunEvent) error) (*sdk.Result, error) {
		<-busy
		return &sdk.Result{}, nil
	})
	set, _ := onlineSet(t, 1, pl)
	prov := set.Providers()[0]
	_, release, err := prov.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if _, _, err := prov.Acquire(); !errors.Is(err, ErrCapacityExhausted) {
		t.Fatalf("second Acquire: %v, want capacity exhausted", err)
	}
	if got, err := prov.Current(); err != nil || got != Plugin(pl) {
		t.Fatalf("Current while busy: %v %v", got, err)
	}
	close(busy)
}
