package pluginhost_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
)

func run(target string) *wirepb.RunRequest {
	return &wirepb.RunRequest{RunId: "run-1", SessionId: "sess-1", Adapter: "testadapter", Target: target}
}

// collect runs req and returns the events emitted and the outcome.
func collect(ctx context.Context, p *pluginhost.Plugin, req *wirepb.RunRequest) ([]*wirepb.RunEvent, *sdk.Result, error) {
	var events []*wirepb.RunEvent
	term, err := p.Execute(ctx, req, nil, func(ev *wirepb.RunEvent) error {
		events = append(events, ev)
		return nil
	})
	if err != nil {
		return events, nil, err
	}
	res, err := pluginhost.ResultOf(term)
	return events, res, err
}

// R2: an ordered stream of events, then exactly one terminal, which becomes
// Execute's return value.
func TestExecuteRelaysEventsInOrderAndReturnsTheOutcome(t *testing.T) {
	usage := &sdk.Usage{PromptTokens: 7, CompletionTokens: 3, TotalDuration: 1500 * time.Millisecond, EvalDuration: time.Second}
	cases := []struct {
		target string
		types  []wirepb.RunEventType
		done   string
	}{
		{"text:5", append(repeat(wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, 5), wirepb.RunEventType_RUN_EVENT_TYPE_USAGE), "stop"},
		{"text:0", []wirepb.RunEventType{wirepb.RunEventType_RUN_EVENT_TYPE_USAGE}, "stop"},
		{"tools", []wirepb.RunEventType{
			wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA,
			wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA,
			wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA,
			wirepb.RunEventType_RUN_EVENT_TYPE_USAGE,
		}, "tool_calls"},
	}
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		for _, c := range cases {
			t.Run(c.target, func(t *testing.T) {
				events, res, err := collect(t.Context(), p, run(c.target))
				if err != nil {
					t.Fatal(err)
				}
				if len(events) != len(c.types) {
					t.Fatalf("got %d events, want %d", len(events), len(c.types))
				}
				for i, ev := range events {
					if ev.GetType() != c.types[i] || ev.GetSeq() != uint64(i+1) || ev.GetRunId() != "run-1" || ev.GetSessionId() != "sess-1" {
						t.Errorf("event %d = %v seq %d run %q session %q", i, ev.GetType(), ev.GetSeq(), ev.GetRunId(), ev.GetSessionId())
					}
					if strings.HasPrefix(c.target, "text") && ev.GetType() == wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA && ev.GetText() != fmt.Sprintf("t%d", i) {
						t.Errorf("event %d text %q", i, ev.GetText())
					}
				}
				if c.target == "tools" {
					tc := events[1].GetToolCall()
					if tc.GetId() != "call_1" || tc.GetName() != "get_weather" || string(tc.GetArgumentsJson()) != `{"city":` ||
						string(events[2].GetToolCall().GetArgumentsJson()) != `"Seoul"}` {
						t.Errorf("tool call deltas %v, %v", tc, events[2].GetToolCall())
					}
				}
				if got, err := pluginhost.EventFromWire(events[len(events)-1]); err != nil || got.Kind != sdk.UsageReport || *got.Usage != *usage {
					t.Errorf("usage event %+v (%v), want %+v", got.Usage, err, usage)
				}
				if res.DoneReason != c.done || res.Usage == nil || *res.Usage != *usage {
					t.Errorf("result %+v (usage %+v)", res, res.Usage)
				}
			})
		}
	})
}

func repeat(t wirepb.RunEventType, n int) []wirepb.RunEventType {
	out := make([]wirepb.RunEventType, n)
	for i := range out {
		out[i] = t
	}
	return out
}

type startFunc = func(t *testing.T, minimal bool) (*pluginhost.Plugin, *logRecorder)

var sentinels = map[sdk.Kind]error{
	sdk.KindInternal:        sdk.ErrInternal,
	sdk.KindInvalidRequest:  sdk.ErrInvalidRequest,
	sdk.KindUnauthenticated: sdk.ErrUnauthenticated,
	sdk.KindRateLimited:     sdk.ErrRateLimited,
	sdk.KindModelNotFound:   sdk.ErrModelNotFound,
	sdk.KindUnavailable:     sdk.ErrUnavailable,
	sdk.KindUpstream:        sdk.ErrUpstream,
	sdk.KindUnsupported:     sdk.ErrUnsupported,
}

// An adapter's error keeps its kind, message, retryability and upstream
// status across the process boundary, so errors.Is works on the host.
func TestFailureKindsSurviveTheBoundary(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		for kind := range sentinels {
			t.Run(kind.String(), func(t *testing.T) {
				events, res, err := collect(t.Context(), p, run("fail:"+kind.String()))
				if res != nil || len(events) != 0 {
					t.Fatalf("result %v, events %v", res, events)
				}
				for k, s := range sentinels {
					if errors.Is(err, s) != (k == kind) {
						t.Errorf("errors.Is(%v, %v) = %v", err, s, errors.Is(err, s))
					}
				}
				var e *sdk.Error
				if !errors.As(err, &e) {
					t.Fatalf("%T is not an *sdk.Error", err)
				}
				want := testadapterError(kind)
				if e.Kind != want.Kind || e.Message != want.Message || e.Retryable != want.Retryable || e.UpstreamStatus != want.UpstreamStatus {
					t.Errorf("error %+v, want %+v", e, want)
				}
				if f := pluginhost.FailureToWire(err); f.GetMessage() != want.Message || int(f.GetUpstreamStatus()) != want.UpstreamStatus {
					t.Errorf("FailureToWire = %v", f)
				}
				// The terminal crosses once: Execute hands the Node the
				// plugin's FAILED terminal itself, to relay.
				term, err := p.Execute(t.Context(), run("fail:"+kind.String()), nil, func(*wirepb.RunEvent) error { return nil })
				if err != nil {
					t.Fatalf("Execute: %v, want the plugin's terminal", err)
				}
				if wf := pluginhost.FailureToWire(want); term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_FAILED || !proto.Equal(term.GetFailure(), wf) {
					t.Errorf("terminal %v, want FAILED with %v", term, wf)
				}
			})
		}
	})
}

func testadapterError(k sdk.Kind) *sdk.Error {
	return &sdk.Error{Kind: k, Message: "scripted " + k.String(), Retryable: k == sdk.KindRateLimited, UpstreamStatus: 400 + int(k)}
}

// Strict configuration: an unknown key is refused as invalid_request.
func TestConfigureRejectsUnknownKeys(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		err := p.Configure(t.Context(), sdk.Config(`{"prefx":"typo"}`))
		if !errors.Is(err, sdk.ErrInvalidRequest) || !strings.Contains(err.Error(), "prefx") {
			t.Fatalf("Configure with an unknown key: %v", err)
		}
		if err := p.Configure(t.Context(), sdk.MustConfig(map[string]string{"prefix": ">"})); err != nil {
			t.Fatal(err)
		}
		events, _, err := collect(t.Context(), p, run("text:1"))
		if err != nil || events[0].GetText() != ">t0" {
			t.Fatalf("configured run: %v, %v", events, err)
		}
	})
}

// A panic in an adapter method fails that call as internal; the plugin
// keeps serving.
func TestAdapterPanicFailsTheCallNotThePlugin(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		_, _, err := collect(t.Context(), p, run("panic"))
		if !errors.Is(err, sdk.ErrInternal) || !strings.Contains(err.Error(), "panicked in Execute") {
			t.Fatalf("Execute panic: %v", err)
		}
		_, err = p.Probe(t.Context(), "panic")
		if !errors.Is(err, sdk.ErrInternal) || !strings.Contains(err.Error(), "panicked in Probe") {
			t.Fatalf("Probe panic: %v", err)
		}
		if _, _, err := collect(t.Context(), p, run("text:1")); err != nil {
			t.Fatalf("run after the panics: %v", err)
		}
	})
}

// An event the adapter should not send is refused by Send; returning that
// error fails the run as internal.
func TestInvalidEventIsRefusedToTheAdapter(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		events, _, err := collect(t.Context(), p, run("badevent"))
		if !errors.Is(err, sdk.ErrInternal) || !strings.Contains(err.Error(), "invalid event kind 0") || len(events) != 0 {
			t.Fatalf("events %v, err %v", events, err)
		}
	})
}

// R10: cancelling the run's ctx reaches the adapter (its ctx is done) and
// Execute returns at once, leaving no goroutine behind.
func TestCancelReachesTheAdapterPromptly(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() {
			_, _, err := collect(ctx, p, run("sleep"))
			errc <- err
		}()
		waitFor(t, "the run to start", 5*time.Second, func() bool { return stats(t, p) == "active=1 cancelled=0" })
		cancel()
		select {
		case err := <-errc:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Execute after cancel: %v", err)
			}
		case <-time.After(time.Second):
			t.Fatal("Execute did not return within 1s of the cancel")
		}
		waitFor(t, "the adapter to see the cancel", 5*time.Second, func() bool { return stats(t, p) == "active=0 cancelled=1" })
	})
}

func stats(t *testing.T, p *pluginhost.Plugin) string {
	t.Helper()
	h, err := p.Probe(t.Context(), "stats")
	if err != nil {
		t.Fatal(err)
	}
	return h.Detail
}

// If the Node cannot relay an event, the run stops: Execute returns the
// relay's error and the adapter's Send fails.
func TestEmitErrorCancelsTheRun(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		relayErr := errors.New("edge went away")
		n := 0
		_, err := p.Execute(t.Context(), run("text:100000"), nil, func(*wirepb.RunEvent) error {
			n++
			if n == 3 {
				return relayErr
			}
			return nil
		})
		if !errors.Is(err, relayErr) || n != 3 {
			t.Fatalf("Execute = %v after %d events", err, n)
		}
		waitFor(t, "the adapter to stop", 5*time.Second, func() bool { return strings.HasPrefix(stats(t, p), "active=0") })
	})
}

// Runs are independent and concurrent: each gets its own ordered stream
// and its own outcome.
func TestConcurrentRunsKeepTheirOwnStreams(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		const runs = 16
		errc := make(chan error, runs)
		for i := range runs {
			go func() {
				req := run(fmt.Sprintf("text:%d", 20+i))
				req.RunId = fmt.Sprintf("run-%d", i)
				events, res, err := collect(t.Context(), p, req)
				switch {
				case err != nil:
					errc <- err
				case len(events) != 21+i || res.DoneReason != "stop":
					errc <- fmt.Errorf("run %d: %d events, result %+v", i, len(events), res)
				default:
					for j, ev := range events {
						if ev.GetRunId() != req.RunId || ev.GetSeq() != uint64(j+1) {
							errc <- fmt.Errorf("run %d event %d: %v", i, j, ev)
							return
						}
					}
					errc <- nil
				}
			}()
		}
		for range runs {
			if err := <-errc; err != nil {
				t.Error(err)
			}
		}
	})
}
