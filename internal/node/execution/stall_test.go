package execution

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// The watchdog wired into the run and tunnel paths (R4–R7, S5), end to end
// through serveRun and serveTunnel with fake plugins, in synctest bubbles:
// the clock is fake, nothing sleeps.

const stallMs = 4000

// stallingRun sends tokens, then goes silent until its context ends, then
// tries to send one more event (which the fence must drop) and returns.
func stallingRun(tokens int, fenced *atomic.Int32) func(ctx context.Context, _ *wirepb.RunRequest, emit func(*wirepb.RunEvent) error) (*sdk.Result, error) {
	return func(ctx context.Context, _ *wirepb.RunRequest, emit func(*wirepb.RunEvent) error) (*sdk.Result, error) {
		for i := range tokens {
			time.Sleep(time.Second)
			if err := emit(text(string(rune('a' + i)))); err != nil {
				return nil, err
			}
		}
		<-ctx.Done()
		if err := emit(text("late secret output")); errors.Is(err, ErrFenced) {
			fenced.Add(1)
		}
		return nil, context.Cause(ctx)
	}
}

func health(s sdk.HealthStatus) func(context.Context, string) (sdk.Health, error) {
	return func(context.Context, string) (sdk.Health, error) { return sdk.Health{Status: s}, nil }
}

func stallReq(id string) *wirepb.RunRequest {
	r := run(id)
	r.ResponseStallTimeoutMs = stallMs
	return r
}

// R5, R6, R7: a run that stops making progress ends, exactly at the stall
// timeout after its last token, with one response_stalled terminal whose
// observation is complete, safe, and numbered by the session; the event the
// provider sends after the fence is dropped.
func TestRunStallEndsWithOneObservedTerminal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var fenced atomic.Int32
		pl := newFakePlugin(stallingRun(2, &fenced))
		pl.probe = health(sdk.HealthAvailable)
		_, h := onlineSet(t, 1, pl)
		sess := transport.NewSession("node-a", 42, time.Now())
		st := newFakeStream()
		start := time.Now()
		h.serveRun(t.Context(), sess, stallReq("s1"), st)
		took := time.Since(start)
		st.cancel()

		evs := st.events()
		term := requireOneTerminal(t, evs)
		if len(evs) != 3 || term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED {
			t.Fatalf("events = %v", evs)
		}
		// Last token at 2s; the stall is claimed at 2s+4s; the call returns
		// at once and the probe answers at once: nothing extends it.
		if want := 2*time.Second + stallMs*time.Millisecond; took != want {
			t.Errorf("terminal after %v, want exactly %v", took, want)
		}
		o := term.GetStall()
		want := &wirepb.StallObservation{StallTimeoutMs: stallMs, SinceLastProgressMs: stallMs, CloseConfirmed: true,
			ProviderHealth: HealthAvailable, LivenessClassification: LivenessRequestStalled, HealthObservationSeq: 1,
			NodeId: "node-a", Generation: 42, Retryable: true, Provider: "p", Target: "m"}
		if o.String() != want.String() {
			t.Errorf("observation\n got %v\nwant %v", o, want)
		}
		if strings.Contains(term.String(), "secret") {
			t.Errorf("terminal carries payload text: %v", term)
		}
		synctest.Wait()
		if fenced.Load() != 1 {
			t.Errorf("late event after the fence: fenced %d, want 1 (dropped, not emitted)", fenced.Load())
		}
		// The next observation on this session takes the next sequence.
		st2 := newFakeStream()
		h.serveRun(t.Context(), sess, stallReq("s2"), st2)
		st2.cancel()
		if seq := requireOneTerminal(t, st2.events()).GetStall().GetHealthObservationSeq(); seq != 2 {
			t.Errorf("second observation seq = %d, want 2", seq)
		}
		// R7: a path with no connection omits the key.
		st3 := newFakeStream()
		h.serveRun(t.Context(), nil, stallReq("s3"), st3)
		st3.cancel()
		if o := requireOneTerminal(t, st3.events()).GetStall(); o.GetHealthObservationSeq() != 0 || o.GetNodeId() != "" {
			t.Errorf("unbound observation = %v, want no seq and no node", o)
		}
	})
}

// R5: the default stall timeout (wire 0) is 300 s, and progress keeps a
// slow run alive indefinitely: 20 tokens 200 s apart never stall.
func TestRunProgressKeepsTheWatchdogQuiet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pl := newFakePlugin(func(ctx context.Context, _ *wirepb.RunRequest, emit func(*wirepb.RunEvent) error) (*sdk.Result, error) {
			for range 20 {
				time.Sleep(200 * time.Second)
				usage := &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_USAGE, Usage: &wirepb.Usage{CompletionTokens: 1}}
				if err := emit(usage); err != nil {
					return nil, err
				}
			}
			return &sdk.Result{DoneReason: "stop"}, nil
		})
		_, h := onlineSet(t, 1, pl)
		st := newFakeStream()
		serve(h, t.Context(), run("slow"), st)
		if term := requireOneTerminal(t, st.events()); term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
			t.Errorf("terminal = %v", term)
		}
	})
}

// R5: a provider call that ignores its cancel is not confirmed closed: the
// terminal goes out when the close grace ends, retryable is false, and the
// capacity slot stays taken until the call really returns. The terminal is
// the watchdog timer's: the handler's goroutine is the call's, stuck in it
// until it returns (issue 25).
func TestRunStallWithoutCloseConfirmation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		unstick := make(chan struct{})
		pl := newFakePlugin(func(_ context.Context, _ *wirepb.RunRequest, emit func(*wirepb.RunEvent) error) (*sdk.Result, error) {
			<-unstick // deaf to ctx
			if err := emit(text("late")); !errors.Is(err, ErrFenced) {
				t.Errorf("the call's late output: %v, want ErrFenced", err)
			}
			return nil, errTest
		})
		pl.probe = health(sdk.HealthAvailable)
		set, h := onlineSet(t, 1, pl)
		h.live = Liveness{CloseGrace: time.Second, ProbeTimeout: 500 * time.Millisecond}
		st := newFakeStream()
		served := make(chan struct{})
		go func() {
			defer close(served)
			h.serveRun(t.Context(), nil, stallReq("deaf"), st)
			st.cancel()
		}()
		time.Sleep(stallMs*time.Millisecond + time.Second - time.Millisecond)
		synctest.Wait()
		if evs := st.events(); len(evs) != 0 {
			t.Fatalf("sent before the close grace ended: %v", evs)
		}
		time.Sleep(time.Millisecond) // the timeout and the close grace are over
		synctest.Wait()
		o := requireOneTerminal(t, st.events()).GetStall()
		if o.GetCloseConfirmed() || o.GetRetryable() || o.GetLivenessClassification() != LivenessRequestStalled {
			t.Errorf("observation = %v, want close not confirmed, not retryable, request_stalled", o)
		}
		select {
		case <-served:
			t.Fatal("the handler returned while its call is stuck: the call is not on its goroutine")
		default:
		}
		if n := set.Providers()[0].InUse(); n != 1 {
			t.Errorf("slots in use after the terminal = %d, want 1 (the call has not returned)", n)
		}
		close(unstick)
		<-served
		if n := set.Providers()[0].InUse(); n != 0 {
			t.Errorf("slots in use after the call returned = %d, want 0", n)
		}
		requireOneTerminal(t, st.events()) // the call's late output and return send nothing
	})
}

// R6: the probe's answer decides the evidence; unavailable marks the
// target on the Node (reported to the Edge) and starts recovery probes,
// which clear the mark once the target answers again.
func TestRunStallEvidenceAndTargetRecovery(t *testing.T) {
	for _, c := range []struct {
		name      string
		probe     func(context.Context, string) (sdk.Health, error)
		health    string
		class     string
		unhealthy bool
	}{
		{"available", health(sdk.HealthAvailable), HealthAvailable, LivenessRequestStalled, false},
		{"unavailable", health(sdk.HealthUnavailable), HealthUnavailable, LivenessProviderUnhealthy, true},
		{"probe error", func(context.Context, string) (sdk.Health, error) { return sdk.Health{}, errTest }, HealthUnknown, LivenessHealthUnknown, false},
		{"probe hangs", func(ctx context.Context, _ string) (sdk.Health, error) {
			<-ctx.Done()
			return sdk.Health{Status: sdk.HealthUnavailable}, nil
		}, HealthUnknown, LivenessHealthUnknown, false},
		{"no probe", nil, HealthUnknown, LivenessHealthUnknown, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var fenced atomic.Int32
				pl := newFakePlugin(stallingRun(0, &fenced))
				var down atomic.Bool
				down.Store(c.unhealthy)
				pl.probe = c.probe
				if c.unhealthy {
					pl.probe = func(context.Context, string) (sdk.Health, error) {
						if down.Load() {
							return sdk.Health{Status: sdk.HealthUnavailable}, nil
						}
						return sdk.Health{Status: sdk.HealthAvailable}, nil
					}
				}
				set, h := onlineSet(t, 1, pl)
				changed := set.Changed()
				st := newFakeStream()
				serve(h, t.Context(), stallReq("e"), st)
				o := requireOneTerminal(t, st.events()).GetStall()
				if o.GetProviderHealth() != c.health || o.GetLivenessClassification() != c.class {
					t.Fatalf("evidence = %s/%s, want %s/%s", o.GetProviderHealth(), o.GetLivenessClassification(), c.health, c.class)
				}
				// A successful probe grants nothing: retryable follows the
				// close alone (confirmed here).
				if !o.GetRetryable() {
					t.Errorf("retryable = false with the close confirmed")
				}
				prov := set.Providers()[0]
				if got := targetHealth(prov); got != map[bool]string{true: TargetHealthUnavailable}[c.unhealthy] {
					t.Fatalf("target health on the wire = %q", got)
				}
				if !c.unhealthy {
					return
				}
				select {
				case <-changed:
				default:
					t.Fatal("marking the target unavailable was not reported")
				}
				// Recovery: the target stays marked while it is down …
				time.Sleep(2 * time.Minute)
				if !prov.TargetUnhealthy("m") {
					t.Fatal("target cleared while its probe still says unavailable")
				}
				// … and is cleared by the first probe after it is back.
				down.Store(false)
				time.Sleep(31 * time.Second)
				if prov.TargetUnhealthy("m") || targetHealth(prov) != "" {
					t.Errorf("target still marked after it answered its probe")
				}
			})
		})
	}
}

func targetHealth(p *Provider) string {
	for _, tg := range p.Wire().GetTargets() {
		if tg.GetName() == "m" {
			return tg.GetHealth()
		}
	}
	return "missing"
}

// S5: a hard deadline that falls on the very instant the stall timer
// fires wins; so does an Edge cancel that comes first.
func TestRunStallPrecedence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var fenced atomic.Int32
		pl := newFakePlugin(stallingRun(0, &fenced))
		pl.probe = health(sdk.HealthAvailable)
		_, h := onlineSet(t, 1, pl)

		st := newFakeStream()
		req := stallReq("tie")
		req.DeadlineUnixMs = time.Now().Add(stallMs * time.Millisecond).UnixMilli()
		serve(h, t.Context(), req, st)
		if term := requireOneTerminal(t, st.events()); term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED {
			t.Errorf("deadline at the stall instant: terminal = %v, want DEADLINE_EXCEEDED", term)
		}

		conn, drop := context.WithCancel(t.Context())
		st = newFakeStream()
		time.AfterFunc(stallMs*time.Millisecond-time.Millisecond, drop)
		serve(h, conn, stallReq("gone"), st)
		if term := requireOneTerminal(t, st.events()); term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED {
			t.Errorf("disconnect before the stall: terminal = %v, want DISCONNECTED", term)
		}
		if n := pl.probes.Load(); n != 0 {
			t.Errorf("%d probes ran although no stall was claimed", n)
		}
	})
}

// R5: one watchdog serves tunnels too. SSE keep-alive comments are not
// progress; the tunnel ends with one response_stalled terminal after the
// head and the data it did send.
func TestTunnelStallKeepAlivesAreNotProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pl := newTunnelPlugin(func(ctx context.Context, _ *wirepb.TunnelRequest, body io.Reader, emit func(*wirepb.TunnelFrame) error) error {
			if _, err := io.ReadAll(body); err != nil {
				return err
			}
			if err := emit(headFrame(200)); err != nil {
				return err
			}
			if err := emit(bodyFrame("data: {\"x\":1}\n\n")); err != nil {
				return err
			}
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-tick.C:
				}
				if err := emit(bodyFrame(": keep-alive\n\n")); err != nil {
					return err
				}
			}
		})
		pl.probe = health(sdk.HealthUnavailable)
		_, h := onlineSet(t, 1, pl)
		st := newFakeTunnelStream(true, "{}")
		req := tunnelReq("t")
		req.ResponseStallTimeoutMs = stallMs
		sess := transport.NewSession("node-a", 9, time.Now())
		start := time.Now()
		h.serveTunnel(t.Context(), sess, req, st)
		took := time.Since(start)
		st.cancel()
		sent, _ := st.frames()
		last := sent[len(sent)-1].GetTerminal()
		if last.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED {
			t.Fatalf("terminal = %v", last)
		}
		if took != stallMs*time.Millisecond {
			t.Errorf("stalled after %v, want %v: keep-alives must not reset the timer", took, stallMs*time.Millisecond)
		}
		o := last.GetStall()
		if o.GetLivenessClassification() != LivenessProviderUnhealthy || o.GetHealthObservationSeq() != 1 || o.GetGeneration() != 9 {
			t.Errorf("observation = %v", o)
		}
		for i, f := range sent[:len(sent)-1] {
			if f.GetTerminal() != nil {
				t.Errorf("frame %d is a second terminal", i)
			}
		}
	})
}

// S5 and decision 5 through serveRun: every cause that can end a silent
// run, a little before, at, or a little after the instant the stall timer
// fires (4s), ends it with exactly one terminal, and the right one: what
// comes first wins, and a hard deadline wins a tie with the stall.
func TestRunOneTerminalUnderEveryInterleaving(t *testing.T) {
	const T = stallMs * time.Millisecond
	stalled := wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED
	for _, c := range []struct {
		cause string
		at    time.Duration
		want  wirepb.RunEventType
	}{
		{"provider returns", T - time.Millisecond, wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED},
		{"provider returns", T + time.Millisecond, stalled},
		{"edge cancels", T - time.Millisecond, wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED},
		{"edge cancels", T + time.Millisecond, stalled},
		{"deadline", T - time.Millisecond, wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED},
		{"deadline", T, wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED},
		{"deadline", T + time.Millisecond, stalled},
		{"disconnect", T - time.Millisecond, wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED},
		{"disconnect", T + time.Millisecond, stalled},
	} {
		t.Run(fmt.Sprintf("%s at %v", c.cause, c.at), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				pl := newFakePlugin(func(ctx context.Context, _ *wirepb.RunRequest, _ func(*wirepb.RunEvent) error) (*sdk.Result, error) {
					if c.cause != "provider returns" {
						<-ctx.Done()
						return nil, ctx.Err()
					}
					select {
					case <-ctx.Done():
						return nil, ctx.Err()
					case <-time.After(c.at):
						return &sdk.Result{DoneReason: "stop"}, nil
					}
				})
				pl.probe = health(sdk.HealthAvailable)
				_, h := onlineSet(t, 1, pl)
				conn, disconnect := context.WithCancel(t.Context())
				defer disconnect()
				st := newFakeStream()
				req := stallReq("r")
				switch c.cause {
				case "edge cancels":
					time.AfterFunc(c.at, st.cancel)
				case "deadline":
					req.DeadlineUnixMs = time.Now().Add(c.at).UnixMilli()
				case "disconnect":
					time.AfterFunc(c.at, disconnect)
				}
				h.serveRun(conn, nil, req, st)
				evs := st.events()
				st.cancel()
				if c.cause == "edge cancels" && c.want != stalled {
					// The Edge reset the stream: the terminal cannot reach it;
					// nothing may have been sent after the cancel either.
					if len(evs) != 0 {
						t.Fatalf("events after the Edge's cancel: %v", evs)
					}
					return
				}
				if term := requireOneTerminal(t, evs); term.GetType() != c.want {
					t.Fatalf("terminal = %v, want %v", term.GetType(), c.want)
				}
			})
		})
	}
}
