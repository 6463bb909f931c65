package execution

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/encoding/prototext"

	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// All watchdog tests run in a synctest bubble: the clock is fake and only
// moves when every goroutine in the bubble is blocked. No real sleeps.

const wdTimeout = 10 * time.Second

func stalledNow(w *Watchdog) bool {
	select {
	case <-w.Stalled():
		return true
	default:
		return false
	}
}

func wdConfig() WatchdogConfig {
	return WatchdogConfig{StallTimeout: wdTimeout, CloseGrace: 2 * time.Second, ProbeTimeout: 3 * time.Second,
		NodeID: "node-1", Generation: 7, Provider: "ollama", Target: "llama3"}
}

func noSend() error { return nil }

func TestWatchdogFiresAtExactlyTheTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := NewClaim(context.Background())
		w := NewWatchdog(wdConfig(), c, nil)
		w.Start()
		time.Sleep(wdTimeout - time.Nanosecond)
		synctest.Wait()
		if stalledNow(w) {
			t.Fatal("stalled 1ns before the timeout")
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if !stalledNow(w) {
			t.Fatal("not stalled at the timeout")
		}
		if c.Winner() != CauseStalled || !w.Fenced() {
			t.Fatalf("winner %q fenced %v", c.Winner(), w.Fenced())
		}
	})
}

func TestWatchdogNotArmedBeforeStartAndStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := NewClaim(context.Background())
		w := NewWatchdog(wdConfig(), c, nil)
		time.Sleep(3 * wdTimeout)
		synctest.Wait()
		if stalledNow(w) {
			t.Fatal("stalled without Start")
		}
		w.Start()
		time.Sleep(wdTimeout / 2)
		w.Stop()
		time.Sleep(3 * wdTimeout)
		synctest.Wait()
		if stalledNow(w) || c.Winner() != CauseNone {
			t.Fatal("stalled after Stop")
		}
	})
}

func TestProgressClassifiers(t *testing.T) {
	usage := &wirepb.Usage{CompletionTokens: 3}
	runs := []struct {
		name string
		ev   *wirepb.RunEvent
		want bool
	}{
		{"text", &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: "a"}, true},
		{"reasoning", &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA, Text: "a"}, true},
		{"tool call", &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA, ToolCall: &wirepb.ToolCall{Name: "f"}}, true},
		{"usage", &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_USAGE, Usage: usage}, true},
		{"unspecified", &wirepb.RunEvent{Text: "a"}, false},
		{"nil", nil, false},
		{"completed with usage", &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, Usage: usage, Text: "a"}, false},
		{"failed", &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, Usage: usage}, false},
		{"stalled", &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED}, false},
	}
	for _, c := range runs {
		if got := RunEventIsProgress(c.ev); got != c.want {
			t.Errorf("run %s: progress %v, want %v", c.name, got, c.want)
		}
	}
	body := func(s string) *wirepb.TunnelFrame {
		return &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: []byte(s)}}
	}
	tunnels := []struct {
		name string
		f    *wirepb.TunnelFrame
		want bool
	}{
		{"ndjson", body(`{"response":"a"}` + "\n"), true},
		{"sse data", body("data: {}\n\n"), true},
		{"comment then data", body(": ping\ndata: x\n"), true},
		{"partial line", body("da"), true},
		{"sse keep-alive", body(": keep-alive\n\n"), false},
		{"sse keep-alive crlf", body(":\r\n\r\n"), false},
		{"blank", body("\n"), false},
		{"empty body", body(""), false},
		{"head", &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Head{Head: &wirepb.TunnelResponseHead{Status: 200}}}, false},
		{"terminal", &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Terminal{Terminal: &wirepb.TunnelTerminal{}}}, false},
		{"empty", &wirepb.TunnelFrame{}, false},
		{"nil", nil, false},
	}
	for _, c := range tunnels {
		if got := TunnelFrameIsProgress(c.f); got != c.want {
			t.Errorf("tunnel %s: progress %v, want %v", c.name, got, c.want)
		}
	}
}

// Each kind of progress resets the timer; each non-progress does not.
func TestWatchdogOnlyProgressResetsTheTimer(t *testing.T) {
	usage := &wirepb.Usage{CompletionTokens: 1}
	items := []struct {
		name     string
		progress bool
	}{
		{"text", RunEventIsProgress(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: "x"})},
		{"reasoning", RunEventIsProgress(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA, Text: "x"})},
		{"tool call", RunEventIsProgress(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA})},
		{"usage", RunEventIsProgress(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_USAGE, Usage: usage})},
		{"tunnel data", TunnelFrameIsProgress(&wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: []byte("{}\n")}})},
	}
	non := []struct {
		name     string
		progress bool
	}{
		{"terminal with usage", RunEventIsProgress(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, Usage: usage})},
		{"sse keep-alive", TunnelFrameIsProgress(&wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: []byte(": ping\n\n")}})},
		{"head", TunnelFrameIsProgress(&wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Head{Head: &wirepb.TunnelResponseHead{Status: 200}}})},
	}
	for _, c := range items {
		t.Run("progress/"+c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := NewWatchdog(wdConfig(), NewClaim(context.Background()), nil)
				w.Start()
				time.Sleep(wdTimeout / 2)
				if err := w.Emit(c.progress, noSend); err != nil {
					t.Fatal(err)
				}
				time.Sleep(wdTimeout - time.Nanosecond)
				synctest.Wait()
				if stalledNow(w) {
					t.Fatal("stalled 1ns before the timeout since the progress")
				}
				time.Sleep(time.Nanosecond)
				synctest.Wait()
				if !stalledNow(w) {
					t.Fatal("not stalled at the timeout since the progress")
				}
			})
		})
	}
	for _, c := range non {
		t.Run("non-progress/"+c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := NewWatchdog(wdConfig(), NewClaim(context.Background()), nil)
				w.Start()
				time.Sleep(wdTimeout / 2)
				if err := w.Emit(c.progress, noSend); err != nil {
					t.Fatal(err)
				}
				time.Sleep(wdTimeout/2 - time.Nanosecond)
				synctest.Wait()
				if stalledNow(w) {
					t.Fatal("stalled early")
				}
				time.Sleep(time.Nanosecond)
				synctest.Wait()
				if !stalledNow(w) {
					t.Fatal("non-progress reset the timer")
				}
			})
		})
	}
	t.Run("Progress", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			w := NewWatchdog(wdConfig(), NewClaim(context.Background()), nil)
			w.Start()
			for range 5 {
				time.Sleep(wdTimeout - time.Nanosecond)
				w.Progress()
			}
			synctest.Wait()
			if stalledNow(w) {
				t.Fatal("stalled despite progress")
			}
			time.Sleep(wdTimeout)
			synctest.Wait()
			if !stalledNow(w) {
				t.Fatal("not stalled")
			}
		})
	})
}

// fakeCall is a provider call that, when cancelled, returns after
// returnAfter (never, if negative), telling the watchdog.
type fakeCall struct {
	returnAfter time.Duration
	w           *Watchdog
	cause       error
}

func (c *fakeCall) cancel(cause error) {
	c.cause = cause
	if c.returnAfter >= 0 {
		time.AfterFunc(c.returnAfter, c.w.CallReturned)
	}
}

// stallAndFinish runs a watchdog to its stall and returns Finish's result
// and how long Finish took.
func stallAndFinish(t *testing.T, cfg WatchdogConfig, returnAfter time.Duration) (*wirepb.StallObservation, time.Duration, *Watchdog, *fakeCall) {
	t.Helper()
	call := &fakeCall{returnAfter: returnAfter}
	w := NewWatchdog(cfg, NewClaim(context.Background()), call.cancel)
	call.w = w
	w.Start()
	<-w.Stalled()
	start := time.Now()
	obs := w.Finish()
	took := time.Since(start)
	if obs == nil {
		t.Fatal("Finish returned nil after a stall")
	}
	if !errors.Is(call.cause, ErrStalled) {
		t.Fatalf("call cancelled with %v, want ErrStalled", call.cause)
	}
	return obs, took, w, call
}

func TestWatchdogCloseGrace(t *testing.T) {
	cases := []struct {
		name        string
		returnAfter time.Duration
		want        bool
	}{
		{"returns at once", 0, true},
		{"returns inside the grace", 2*time.Second - time.Nanosecond, true},
		{"returns at the end of the grace", 2 * time.Second, false},
		{"returns after the grace", 3 * time.Second, false},
		{"never returns", -1, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := wdConfig()
				cfg.Probe = func(context.Context) (sdk.Health, error) { return sdk.Health{Status: sdk.HealthAvailable}, nil }
				obs, _, _, _ := stallAndFinish(t, cfg, c.returnAfter)
				if obs.GetCloseConfirmed() != c.want || obs.GetRetryable() != c.want {
					t.Fatalf("close_confirmed %v retryable %v, want %v", obs.GetCloseConfirmed(), obs.GetRetryable(), c.want)
				}
			})
		})
	}
	t.Run("returned before the stall", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			w := NewWatchdog(wdConfig(), NewClaim(context.Background()), nil)
			w.Start()
			time.Sleep(wdTimeout / 2)
			w.CallReturned() // e.g. the adapter returned but the outcome is not claimed yet
			<-w.Stalled()
			if obs := w.Finish(); !obs.GetCloseConfirmed() || !obs.GetRetryable() {
				t.Fatalf("not confirmed: %v", obs)
			}
		})
	})
}

func TestEvidenceFrom(t *testing.T) {
	av := Evidence{HealthAvailable, LivenessRequestStalled}
	un := Evidence{HealthUnavailable, LivenessProviderUnhealthy}
	uk := Evidence{HealthUnknown, LivenessHealthUnknown}
	cases := []struct {
		h    sdk.Health
		err  error
		want Evidence
	}{
		{sdk.Health{Status: sdk.HealthAvailable}, nil, av},
		{sdk.Health{Status: sdk.HealthUnavailable, Detail: "refused"}, nil, un},
		{sdk.Health{Status: sdk.HealthUnknown}, nil, uk},
		{sdk.Health{Status: sdk.HealthStatus(42)}, nil, uk},
		{sdk.Health{Status: sdk.HealthAvailable}, errors.New("boom"), uk},
		{sdk.Health{Status: sdk.HealthUnavailable}, context.DeadlineExceeded, uk},
	}
	for _, c := range cases {
		if got := EvidenceFrom(c.h, c.err); got != c.want {
			t.Errorf("EvidenceFrom(%v, %v) = %v, want %v", c.h, c.err, got, c.want)
		}
	}
}

func TestWatchdogEvidenceMatrix(t *testing.T) {
	answer := func(s sdk.HealthStatus, err error) func(context.Context) (sdk.Health, error) {
		return func(context.Context) (sdk.Health, error) { return sdk.Health{Status: s}, err }
	}
	cases := []struct {
		name           string
		probe          func(context.Context) (sdk.Health, error)
		health, liveas string
	}{
		{"available", answer(sdk.HealthAvailable, nil), HealthAvailable, LivenessRequestStalled},
		{"unavailable", answer(sdk.HealthUnavailable, nil), HealthUnavailable, LivenessProviderUnhealthy},
		{"ambiguous", answer(sdk.HealthUnknown, nil), HealthUnknown, LivenessHealthUnknown},
		{"error", answer(sdk.HealthAvailable, errors.New("connection refused")), HealthUnknown, LivenessHealthUnknown},
		{"no probe", nil, HealthUnknown, LivenessHealthUnknown},
		{"timeout (honours ctx)", func(ctx context.Context) (sdk.Health, error) {
			<-ctx.Done()
			return sdk.Health{Status: sdk.HealthAvailable}, nil
		}, HealthUnknown, LivenessHealthUnknown},
		{"timeout (ignores ctx)", func(context.Context) (sdk.Health, error) {
			time.Sleep(time.Minute)
			return sdk.Health{Status: sdk.HealthAvailable}, nil
		}, HealthUnknown, LivenessHealthUnknown},
		{"answers at the deadline", func(context.Context) (sdk.Health, error) {
			time.Sleep(3 * time.Second)
			return sdk.Health{Status: sdk.HealthAvailable}, nil
		}, HealthUnknown, LivenessHealthUnknown},
		{"answers just inside the deadline", func(context.Context) (sdk.Health, error) {
			time.Sleep(3*time.Second - time.Nanosecond)
			return sdk.Health{Status: sdk.HealthUnavailable}, nil
		}, HealthUnavailable, LivenessProviderUnhealthy},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := wdConfig()
				cfg.Probe = c.probe
				obs, took, _, _ := stallAndFinish(t, cfg, 0)
				if obs.GetProviderHealth() != c.health || obs.GetLivenessClassification() != c.liveas {
					t.Fatalf("evidence %s/%s, want %s/%s", obs.GetProviderHealth(), obs.GetLivenessClassification(), c.health, c.liveas)
				}
				if took > cfg.ProbeTimeout {
					t.Fatalf("Finish took %v, more than the probe timeout %v", took, cfg.ProbeTimeout)
				}
				if !obs.GetRetryable() {
					t.Fatal("the probe changed the retry hint")
				}
				time.Sleep(2 * time.Minute) // let a probe that ignores its ctx end
			})
		})
	}
}

// The probe has its own deadline and context (not the cancelled run's) and
// runs concurrently with the close grace: Finish takes max, not the sum.
func TestWatchdogProbeIsIndependentAndConcurrent(t *testing.T) {
	cases := []struct {
		name        string
		returnAfter time.Duration // after the cancel; -1: never
		probeTakes  time.Duration
		want        time.Duration
	}{
		{"grace is longer", -1, time.Second, 2 * time.Second},
		{"probe is longer", 500 * time.Millisecond, 2500 * time.Millisecond, 2500 * time.Millisecond},
		{"both short", 100 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond},
		{"both to their bounds", -1, time.Hour, 3 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				runCtx, cancelRun := context.WithCancelCause(t.Context())
				cfg := wdConfig()
				var probeCtxErr error
				var probeDeadline time.Duration
				cfg.Probe = func(ctx context.Context) (sdk.Health, error) {
					probeCtxErr = ctx.Err()
					dl, _ := ctx.Deadline()
					probeDeadline = time.Until(dl)
					select {
					case <-time.After(c.probeTakes):
					case <-ctx.Done():
						return sdk.Health{}, ctx.Err()
					}
					return sdk.Health{Status: sdk.HealthAvailable}, nil
				}
				call := &fakeCall{returnAfter: c.returnAfter}
				w := NewWatchdog(cfg, NewClaim(context.Background()), func(cause error) { cancelRun(cause); call.cancel(cause) })
				call.w = w
				w.Start()
				<-w.Stalled()
				start := time.Now()
				obs := w.Finish()
				if took := time.Since(start); took != c.want {
					t.Fatalf("Finish took %v, want %v", took, c.want)
				}
				if runCtx.Err() == nil || !errors.Is(context.Cause(runCtx), ErrStalled) {
					t.Fatal("the run was not cancelled with ErrStalled")
				}
				if probeCtxErr != nil || probeDeadline != cfg.ProbeTimeout {
					t.Fatalf("probe ctx err %v, deadline in %v: want its own %v deadline", probeCtxErr, probeDeadline, cfg.ProbeTimeout)
				}
				if obs.GetCloseConfirmed() != (c.returnAfter >= 0) {
					t.Fatalf("close_confirmed %v", obs.GetCloseConfirmed())
				}
			})
		})
	}
}

// A successful probe does not reset progress, move the fence, or grant
// retry; late output stays fenced, is dropped and counted.
func TestWatchdogFenceAndSuccessfulProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := wdConfig()
		cfg.Probe = func(context.Context) (sdk.Health, error) { return sdk.Health{Status: sdk.HealthAvailable}, nil }
		var sent atomic.Int32
		send := func() error { sent.Add(1); return nil }
		call := &fakeCall{returnAfter: -1}
		c := NewClaim(context.Background())
		w := NewWatchdog(cfg, c, call.cancel)
		call.w = w
		w.Start()
		time.Sleep(time.Second)
		if err := w.Emit(true, send); err != nil {
			t.Fatal(err)
		}
		<-w.Stalled()
		if !w.Fenced() {
			t.Fatal("not fenced at the stall")
		}
		if err := w.Emit(true, send); !errors.Is(err, ErrFenced) {
			t.Fatalf("late output: %v, want ErrFenced", err)
		}
		obs := w.Finish()
		if obs.GetRetryable() || obs.GetCloseConfirmed() {
			t.Fatal("a successful probe granted retry")
		}
		if obs.GetSinceLastProgressMs() != wdTimeout.Milliseconds() {
			t.Fatalf("since_last_progress %d ms", obs.GetSinceLastProgressMs())
		}
		if !w.Fenced() {
			t.Fatal("the probe moved the fence")
		}
		w.Progress()
		if err := w.Emit(false, send); !errors.Is(err, ErrFenced) {
			t.Fatalf("late output: %v, want ErrFenced", err)
		}
		call.w.CallReturned() // a late return confirms nothing now
		if sent.Load() != 1 || w.Dropped() != 2 {
			t.Fatalf("sent %d dropped %d, want 1 and 2", sent.Load(), w.Dropped())
		}
		if again := w.Finish(); again != nil {
			t.Fatal("a second Finish produced a second observation")
		}
		if c.Take(CauseCompleted) || c.Winner() != CauseStalled {
			t.Fatal("a late completion took the outcome")
		}
	})
}

// A send that started before the fence finishes before Finish returns;
// none starts after it.
func TestWatchdogFenceWaitsForInFlightSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := NewWatchdog(wdConfig(), NewClaim(context.Background()), nil)
		w.Start()
		release := make(chan struct{})
		var done atomic.Bool
		go func() {
			time.Sleep(wdTimeout - time.Nanosecond)
			_ = w.Emit(false, func() error { <-release; done.Store(true); return nil })
		}()
		<-w.Stalled()
		go func() { time.Sleep(time.Hour); close(release) }()
		start := time.Now()
		w.Finish()
		if !done.Load() || time.Since(start) != time.Hour {
			t.Fatalf("Finish returned before the in-flight send ended (done %v)", done.Load())
		}
	})
}

func TestWatchdogMetadataHoldsNoPayload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const secret = "SECRET-PROMPT-TEXT"
		cfg := wdConfig()
		var n atomic.Uint64
		cfg.NextSeq = func() uint64 { return n.Add(1) }
		cfg.Probe = func(context.Context) (sdk.Health, error) {
			return sdk.Health{Status: sdk.HealthUnavailable, Detail: secret}, nil
		}
		w := NewWatchdog(cfg, NewClaim(context.Background()), nil)
		w.Start()
		_ = w.Emit(true, noSend) // an event carrying secret text
		<-w.Stalled()
		obs := w.Finish()
		text := prototext.Format(obs)
		if strings.Contains(text, secret) {
			t.Fatalf("observation carries payload text: %s", text)
		}
		want := &wirepb.StallObservation{StallTimeoutMs: 10000, SinceLastProgressMs: 10000, CloseConfirmed: false,
			ProviderHealth: HealthUnavailable, LivenessClassification: LivenessProviderUnhealthy,
			HealthObservationSeq: 1, NodeId: "node-1", Generation: 7, Provider: "ollama", Target: "llama3"}
		if prototext.Format(want) != text {
			t.Fatalf("observation\n%s\nwant\n%s", text, prototext.Format(want))
		}
	})
}

func TestWatchdogObservationSeq(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Uint64
		next := func() uint64 { return n.Add(1) }
		var got []uint64
		for range 3 { // runs and tunnels on one session share the source
			cfg := wdConfig()
			cfg.NextSeq = next
			w := NewWatchdog(cfg, NewClaim(context.Background()), nil)
			w.Start()
			<-w.Stalled()
			got = append(got, w.Finish().GetHealthObservationSeq())
			w.Finish() // no second draw
		}
		if len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 3 || n.Load() != 3 {
			t.Fatalf("seqs %v (drawn %d), want 1 2 3", got, n.Load())
		}

		// Unbound path: the key is omitted.
		w := NewWatchdog(wdConfig(), NewClaim(context.Background()), nil)
		w.Start()
		<-w.Stalled()
		if s := w.Finish().GetHealthObservationSeq(); s != 0 {
			t.Fatalf("seq %d without a session, want 0", s)
		}

		// An observation that is not finalized draws nothing.
		cfg := wdConfig()
		cfg.NextSeq = next
		c := NewClaim(context.Background())
		w = NewWatchdog(cfg, c, nil)
		w.Start()
		time.Sleep(wdTimeout)
		<-w.Stalled()
		if !c.Take(CauseDisconnected) {
			t.Fatal("a disconnect at the stall instant did not win")
		}
		if w.Finish() != nil || n.Load() != 3 {
			t.Fatalf("an overridden stall drew a seq (%d)", n.Load())
		}
	})
}

// One outcome under every interleaving at the same instant; a deadline or
// disconnect wins a tie with the stall timer (S5).
func TestWatchdogOneOutcome(t *testing.T) {
	const rounds = 50
	t.Run("deadline in the run context", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			for range rounds {
				ctx, cancel := context.WithTimeout(t.Context(), wdTimeout)
				c := NewClaim(ctx)
				w := NewWatchdog(wdConfig(), c, nil)
				w.Start()
				time.Sleep(wdTimeout)
				synctest.Wait()
				if stalledNow(w) || c.Winner() != CauseNone {
					t.Fatalf("stall claimed at the deadline instant: %q", c.Winner())
				}
				if !c.Take(CauseDeadline) || c.Take(CauseCompleted) {
					t.Fatal("the deadline did not take the outcome")
				}
				cancel()
			}
		})
	})
	t.Run("run context already done", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(t.Context())
			c := NewClaim(ctx)
			w := NewWatchdog(wdConfig(), c, nil)
			w.Start()
			time.AfterFunc(wdTimeout, func() { cancel(errDisconnected) })
			time.Sleep(2 * wdTimeout)
			synctest.Wait()
			// Either the cancel ran first (the timer yields) or the stall
			// claimed first; in that case a disconnect claim at the same
			// instant would take it over. Here nobody claims, so check
			// that at most the stall did.
			if w := c.Winner(); w != CauseNone && w != CauseStalled {
				t.Fatalf("winner %q", w)
			}
		})
	})
	for _, cause := range []Cause{CauseDeadline, CauseDisconnected} {
		t.Run(cause.String()+" claimed at the stall instant", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				for range rounds {
					cfg := wdConfig()
					var n atomic.Uint64
					cfg.NextSeq = func() uint64 { return n.Add(1) }
					c := NewClaim(context.Background())
					w := NewWatchdog(cfg, c, nil)
					w.Start()
					var won atomic.Bool
					time.AfterFunc(wdTimeout, func() { won.Store(c.Take(cause)) })
					time.Sleep(wdTimeout)
					synctest.Wait()
					if !won.Load() || c.Winner() != cause {
						t.Fatalf("%s lost the tie: winner %q", cause, c.Winner())
					}
					if stalledNow(w) && w.Finish() != nil {
						t.Fatalf("both a stall terminal and %s", cause)
					}
					if n.Load() != 0 {
						t.Fatal("a seq was drawn")
					}
				}
			})
		})
	}
	t.Run("deadline after the stall instant loses", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := NewClaim(context.Background())
			w := NewWatchdog(wdConfig(), c, nil)
			w.Start()
			<-w.Stalled()
			time.Sleep(time.Nanosecond)
			if c.Take(CauseDeadline) || c.Take(CauseDisconnected) {
				t.Fatal("a later deadline took the outcome from the stall")
			}
			if w.Finish() == nil {
				t.Fatal("no stall observation")
			}
		})
	})
	for _, cause := range []Cause{CauseCompleted, CauseCancelled, CauseFailed} {
		t.Run(cause.String()+" racing the stall", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				for range rounds {
					c := NewClaim(context.Background())
					w := NewWatchdog(wdConfig(), c, nil)
					w.Start()
					var won atomic.Bool
					time.AfterFunc(wdTimeout, func() { won.Store(c.Take(cause)) })
					time.Sleep(2 * wdTimeout)
					synctest.Wait()
					stalled := stalledNow(w)
					if stalled == won.Load() {
						t.Fatalf("stalled %v and %s won %v: want exactly one", stalled, cause, won.Load())
					}
					if stalled != (w.Finish() != nil) {
						t.Fatal("Finish disagrees with the claim")
					}
				}
			})
		})
		t.Run(cause.String()+" before the stall", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := NewClaim(context.Background())
				w := NewWatchdog(wdConfig(), c, nil)
				w.Start()
				time.Sleep(wdTimeout - time.Nanosecond)
				if !c.Take(cause) {
					t.Fatal("claim lost")
				}
				time.Sleep(10 * wdTimeout)
				synctest.Wait()
				if stalledNow(w) || w.Finish() != nil || w.Fenced() {
					t.Fatal("stalled after the outcome was claimed")
				}
			})
		})
	}
	t.Run("many claims at once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			for range rounds {
				c := NewClaim(context.Background())
				w := NewWatchdog(wdConfig(), c, nil)
				w.Start()
				var wins atomic.Int32
				var wg sync.WaitGroup
				for _, cause := range []Cause{CauseCompleted, CauseCancelled, CauseFailed, CauseCompleted} {
					wg.Go(func() {
						time.Sleep(wdTimeout)
						if c.Take(cause) {
							wins.Add(1)
						}
					})
				}
				wg.Wait()
				synctest.Wait()
				if stalledNow(w) {
					wins.Add(1)
				}
				if wins.Load() != 1 {
					t.Fatalf("%d winners, want 1", wins.Load())
				}
			}
		})
	})
}
