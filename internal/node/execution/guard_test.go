package execution

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// The guarded call runs on the goroutine that serves the stream, and the
// stall's terminal is sent from the watchdog's timer (issue 25), in
// synctest bubbles: the clock is fake, nothing sleeps.

// A tunnel stuck in its provider call, deaf to the stall's cancel (the
// run's case is TestRunStallWithoutCloseConfirmation): the stall's
// terminal goes out from the timer at the end of the close grace while the
// handler is still in the call; the plugin's terminal when the call comes
// back is refused by the fence: head, then the stall's terminal, only.
func TestStallOfAStuckTunnelIsEndedByTheTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		unstick := make(chan struct{})
		lateErr := make(chan error, 1)
		pl := newTunnelPlugin(func(_ context.Context, _ *wirepb.TunnelRequest, body io.Reader, emit func(*wirepb.TunnelFrame) error) error {
			if _, err := io.ReadAll(body); err != nil {
				return err
			}
			if err := emit(headFrame(200)); err != nil {
				return err
			}
			<-unstick
			lateErr <- emit(terminalFrame(&wirepb.TunnelTerminal{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED}))
			return nil
		})
		pl.probe = health(sdk.HealthAvailable)
		_, h := onlineSet(t, 1, pl)
		h.live = Liveness{CloseGrace: time.Second, ProbeTimeout: 500 * time.Millisecond}
		st := newFakeTunnelStream(true, "{}")
		req := tunnelReq("stuck")
		req.ResponseStallTimeoutMs = stallMs
		served := make(chan struct{})
		go func() {
			defer close(served)
			serveTunnelOn(h, t.Context(), req, st)
		}()

		time.Sleep(stallMs*time.Millisecond + time.Second)
		synctest.Wait()
		sent, _ := st.frames()
		if len(sent) != 2 || sent[0].GetHead() == nil ||
			sent[1].GetTerminal().GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED {
			t.Fatalf("sent %v, want the head and a RESPONSE_STALLED terminal", sent)
		}
		select {
		case <-served:
			t.Fatal("the handler returned while its call is stuck: the call is not on its goroutine")
		default:
		}

		close(unstick)
		<-served
		if err := <-lateErr; !errors.Is(err, ErrFenced) {
			t.Errorf("the plugin's late terminal: %v, want ErrFenced", err)
		}
		if after, _ := st.frames(); len(after) != 2 {
			t.Errorf("sent %d frames after the call returned, want the same 2", len(after))
		}
	})
}

// The call returning at the very instant the stall timer fires: whichever
// claims first, exactly one terminal goes out, the call's COMPLETED or the
// stall's RESPONSE_STALLED (then with its close confirmed: the call
// returned inside the grace); with a hard deadline at that instant as
// well, the stall never wins (S5): the deadline or the call does.
func TestCallReturningAtTheStallInstant(t *testing.T) {
	const T = stallMs * time.Millisecond
	for _, deadline := range []bool{false, true} {
		name := "call returns"
		if deadline {
			name = "deadline and call return"
		}
		t.Run(name, func(t *testing.T) {
			seen := map[wirepb.RunEventType]int{}
			for range 20 {
				synctest.Test(t, func(t *testing.T) {
					pl := newFakePlugin(func(ctx context.Context, _ *wirepb.RunRequest, _ func(*wirepb.RunEvent) error) (*sdk.Result, error) {
						select {
						case <-ctx.Done():
							return nil, ctx.Err()
						case <-time.After(T):
							return &sdk.Result{DoneReason: "stop"}, nil
						}
					})
					pl.probe = health(sdk.HealthAvailable)
					set, h := onlineSet(t, 1, pl)
					st := newFakeStream()
					req := stallReq("tie")
					if deadline {
						req.DeadlineUnixMs = time.Now().Add(T).UnixMilli()
					}
					start := time.Now()
					serve(h, t.Context(), req, st)
					if took := time.Since(start); took != T {
						t.Errorf("ended after %v, want %v", took, T)
					}
					term := requireOneTerminal(t, st.events())
					seen[term.GetType()]++
					switch term.GetType() {
					case wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED:
					case wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED:
						if !deadline {
							t.Errorf("terminal = %v without a deadline", term)
						}
					case wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED:
						if deadline || !term.GetStall().GetCloseConfirmed() {
							t.Errorf("terminal = %v (deadline at the instant: %v)", term, deadline)
						}
					default:
						t.Errorf("terminal = %v", term)
					}
					if n := set.Providers()[0].InUse(); n != 0 {
						t.Errorf("slots in use = %d, want 0", n)
					}
				})
			}
			t.Logf("terminals over 20 runs: %v", seen)
		})
	}
}

// ctxRunStream is a run stream that can tell when its write side ends, as
// a QUIC stream does: nothing may read it for the Edge's cancel.
type ctxRunStream struct {
	*fakeStream
	ctx   context.Context
	end   context.CancelCauseFunc
	reads atomic.Int32
}

func (s *ctxRunStream) Context() context.Context { return s.ctx }

func (s *ctxRunStream) Recv(proto.Message) error {
	s.reads.Add(1)
	return io.EOF
}

// R10 without a reader: on a stream whose write side can tell, the Edge's
// cancel (its STOP_SENDING with the reset) cancels a silent run, and the
// connection's end disconnects it, while nothing reads the stream.
func TestRunCancelIsSeenWithoutReadingTheStream(t *testing.T) {
	for _, c := range []struct {
		name  string
		cause error
		want  error
	}{
		{"edge cancels", &quic.StreamError{ErrorCode: quic.StreamErrorCode(quicwire.StreamCancelled), Remote: true}, errCancelled},
		{"connection ends", &quic.ApplicationError{Remote: true}, errDisconnected},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				got := make(chan error, 1)
				pl := newFakePlugin(func(ctx context.Context, _ *wirepb.RunRequest, _ func(*wirepb.RunEvent) error) (*sdk.Result, error) {
					<-ctx.Done()
					got <- context.Cause(ctx)
					return nil, ctx.Err()
				})
				_, h := onlineSet(t, 1, pl)
				st := &ctxRunStream{fakeStream: newFakeStream()}
				st.ctx, st.end = context.WithCancelCause(t.Context())
				time.AfterFunc(time.Second, func() { st.end(c.cause) })
				h.serveRun(t.Context(), nil, run("r"), st)
				st.cancel()
				if cause := <-got; !errors.Is(cause, c.want) {
					t.Errorf("the run's context ended with %v, want %v", cause, c.want)
				}
				if n := st.reads.Load(); n != 0 {
					t.Errorf("the stream was read %d times for the cancel", n)
				}
			})
		})
	}
}

// Issue 25: a call's log lines read as slog's With would write them, but
// naming the call costs one small allocation where With formatted a
// handler of its own, held while the call waited.
func TestACallsLogLinesReadAsWithsAndCostOneAllocation(t *testing.T) {
	var got, want bytes.Buffer
	noTime := &slog.HandlerOptions{Level: slog.LevelInfo, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}
	h := &Handler{log: slog.New(slog.NewTextHandler(&got, noTime)).With("node", "n1")}
	withs := slog.New(slog.NewTextHandler(&want, noTime)).With("node", "n1")

	l := h.callLog(slog.String("tunnel_id", "tun-1"), slog.String("provider", "ollama"), slog.String("target", "llama3.2:latest"))
	l.Info("tunnel ended", "outcome", "completed", "took", 3*time.Millisecond, "err", nil)
	l.Warn("provider call stalled", "seq", uint64(7))
	l.log = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))
	l.Info("not written: below the level")
	w := withs.With("tunnel_id", "tun-1", "provider", "ollama", "target", "llama3.2:latest")
	w.Info("tunnel ended", "outcome", "completed", "took", 3*time.Millisecond, "err", nil)
	w.Warn("provider call stalled", "seq", uint64(7))
	if got.Len() == 0 || got.String() != want.String() {
		t.Errorf("lines:\n%s\nwant, as With writes them:\n%s", got.String(), want.String())
	}

	if n := testing.AllocsPerRun(50, func() {
		h.callLog(slog.String("tunnel_id", "tun-1"), slog.String("provider", "ollama"), slog.String("target", "llama3.2:latest"))
	}); n > 1 {
		t.Errorf("naming a call allocates %.0f times, want 1", n)
	}
}
