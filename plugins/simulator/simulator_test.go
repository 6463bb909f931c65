package simulator_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/plugins/simulator"
	"github.com/iop-dev/iop/sdk"
)

// sink records events and the (bubble) time each arrived.
type sink struct {
	mu     sync.Mutex
	events []sdk.Event
	at     []time.Duration
	start  time.Time
}

func newSink() *sink { return &sink{start: time.Now()} }

func (s *sink) Send(_ context.Context, ev sdk.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, ev)
	s.at = append(s.at, time.Since(s.start))
	return nil
}

func (s *sink) snapshot() ([]sdk.Event, []time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sdk.Event(nil), s.events...), append([]time.Duration(nil), s.at...)
}

func (s *sink) text() string {
	evs, _ := s.snapshot()
	var b strings.Builder
	for _, ev := range evs {
		if ev.Kind == sdk.TextDelta {
			b.WriteString(ev.Text)
		}
	}
	return b.String()
}

func adapter(t *testing.T, cfg string) *simulator.Adapter {
	t.Helper()
	a := simulator.New()
	if err := a.Configure(t.Context(), sdk.Config(cfg)); err != nil {
		t.Fatal(err)
	}
	return a
}

func run(target, text string) *sdk.Request {
	return &sdk.Request{Target: target, Messages: []sdk.Message{
		{Role: "system", Content: "be kind"},
		{Role: "user", Content: text},
	}}
}

func ptr[T any](v T) *T { return &v }

func TestSameRequestGivesSameTokens(t *testing.T) {
	a := adapter(t, `{"models":[{"name":"m","tokens":12,"token_interval":"0s"},{"name":"n","tokens":12,"token_interval":"0s"}]}`)
	text := func(req *sdk.Request) string {
		s := newSink()
		if _, err := a.Execute(t.Context(), req, s); err != nil {
			t.Fatal(err)
		}
		return s.text()
	}
	base := text(run("m", "hello there"))
	if base == "" || len(strings.Fields(base)) != 12 {
		t.Fatalf("text %q: want 12 words", base)
	}
	again := run("m", "hello there")
	again.Messages[0].Content = "an earlier message does not matter"
	again.RunID, again.SessionID = "other-run", "other-session"
	if got := text(again); got != base {
		t.Errorf("same target, last user message and seed gave %q, then %q", base, got)
	}
	seeded := run("m", "hello there")
	seeded.Options.Seed = ptr(int64(7))
	for name, req := range map[string]*sdk.Request{
		"another target":  run("n", "hello there"),
		"another message": run("m", "hello here"),
		"another seed":    seeded,
	} {
		if got := text(req); got == base {
			t.Errorf("%s gave the same text %q", name, got)
		}
	}
}

func TestDefaultsServeOneSmallModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := simulator.New()
		if err := a.Configure(t.Context(), nil); err != nil {
			t.Fatal(err)
		}
		targets, _ := a.ListTargets(t.Context())
		if len(targets) != 1 || targets[0].Name != simulator.DefaultModel {
			t.Fatalf("targets = %v", targets)
		}
		s := newSink()
		start := time.Now()
		res, err := a.Execute(t.Context(), run(simulator.DefaultModel, "one two three"), s)
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 31*simulator.DefaultTokenInterval {
			t.Errorf("32 tokens took %v, want 31 intervals", d)
		}
		if res.DoneReason != "stop" || res.Usage.PromptTokens != 5 || res.Usage.CompletionTokens != 32 {
			t.Errorf("result %+v usage %+v", res, res.Usage)
		}
	})
}

func TestKnobsShapeTheStreamExactly(t *testing.T) {
	tests := []struct {
		name string
		cfg  string
		max  *int64
		// want lists the events as kind@time, e.g. "t@100ms".
		want   string
		reason string
		usage  int64 // completion tokens
	}{
		{"token timing", `{"name":"m","tokens":3,"token_interval":"50ms"}`, nil,
			"t@0s t@50ms t@100ms u@100ms", "stop", 3},
		{"prefill delay", `{"name":"m","tokens":2,"token_interval":"10ms","prefill_delay":"2s"}`, nil,
			"t@2s t@2.01s u@2.01s", "stop", 2},
		{"reasoning first", `{"name":"m","tokens":2,"token_interval":"1s","prefill_delay":"1s","reasoning":"let me think"}`, nil,
			"r@1s t@1s t@2s u@2s", "stop", 2},
		{"tool call after the text", `{"name":"m","tokens":2,"token_interval":"1s","tool_call":{"name":"f","arguments":{"a":1}}}`, nil,
			"t@0s t@1s c@1s u@1s", "tool_calls", 2},
		{"max tokens cuts the answer and the tool call", `{"name":"m","tokens":5,"token_interval":"1s","tool_call":{"name":"f"}}`, ptr(int64(2)),
			"t@0s t@1s u@1s", "length", 2},
		{"max tokens above the answer", `{"name":"m","tokens":2,"token_interval":"1s"}`, ptr(int64(100)),
			"t@0s t@1s u@1s", "stop", 2},
		{"no tokens", `{"name":"m","tokens":0}`, nil, "u@0s", "stop", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := adapter(t, `{"models":[`+tt.cfg+`]}`)
				req := run("m", "hi")
				req.Options.MaxTokens = tt.max
				s := newSink()
				res, err := a.Execute(t.Context(), req, s)
				if err != nil {
					t.Fatal(err)
				}
				if got := timeline(s); got != tt.want {
					t.Errorf("timeline\n got %s\nwant %s", got, tt.want)
				}
				if res.DoneReason != tt.reason || res.Usage.CompletionTokens != tt.usage {
					t.Errorf("reason %q usage %+v", res.DoneReason, res.Usage)
				}
			})
		})
	}
}

func timeline(s *sink) string {
	evs, at := s.snapshot()
	var parts []string
	for i, ev := range evs {
		k := map[sdk.EventKind]string{sdk.TextDelta: "t", sdk.ReasoningDelta: "r", sdk.ToolCallDelta: "c", sdk.UsageReport: "u"}[ev.Kind]
		parts = append(parts, k+"@"+at[i].String())
	}
	return strings.Join(parts, " ")
}

func TestToolCallCarriesTheConfiguredCall(t *testing.T) {
	a := adapter(t, `{"models":[{"name":"m","tokens":1,"tool_call":{"name":"get_weather","arguments":{"city":"Seoul"}}}]}`)
	s := newSink()
	if _, err := a.Execute(t.Context(), run("m", "hi"), s); err != nil {
		t.Fatal(err)
	}
	evs, _ := s.snapshot()
	tc := evs[1].ToolCall
	if evs[1].Kind != sdk.ToolCallDelta || tc.Name != "get_weather" || tc.Arguments != `{"city":"Seoul"}` || tc.ID == "" || tc.Index != 0 {
		t.Errorf("tool call event %+v %+v", evs[1], tc)
	}
}

func TestStallAfterNTokensWaitsForCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := adapter(t, `{"models":[{"name":"m","tokens":10,"token_interval":"100ms","stall_after":3}]}`)
		ctx, cancel := context.WithCancel(t.Context())
		s := newSink()
		errc := make(chan error, 1)
		go func() {
			_, err := a.Execute(ctx, run("m", "hi"), s)
			errc <- err
		}()
		time.Sleep(time.Hour)
		synctest.Wait()
		select {
		case err := <-errc:
			t.Fatalf("a stalled run returned by itself: %v", err)
		default:
		}
		if got := timeline(s); got != "t@0s t@100ms t@200ms" {
			t.Errorf("before the stall: %s", got)
		}
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
		if got := timeline(s); got != "t@0s t@100ms t@200ms" {
			t.Errorf("output after the stall: %s", got)
		}
	})
}

func TestFailureAfterNTokens(t *testing.T) {
	tests := []struct {
		name, fail string
		want       error
		wantText   int
		wantAt     time.Duration
	}{
		{"rate limited after 2", `{"kind":"rate_limited","message":"slow down","after_tokens":2}`, sdk.ErrRateLimited, 2, 100 * time.Millisecond},
		{"unavailable before any token", `{"kind":"unavailable"}`, sdk.ErrUnavailable, 0, 0},
		{"after more tokens than the answer has", `{"kind":"upstream","after_tokens":99}`, sdk.ErrUpstream, 4, 300 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := adapter(t, `{"models":[{"name":"m","tokens":4,"token_interval":"100ms","fail":`+tt.fail+`}]}`)
				s := newSink()
				start := time.Now()
				res, err := a.Execute(t.Context(), run("m", "hi"), s)
				if !errors.Is(err, tt.want) || res != nil {
					t.Fatalf("res %+v err %v, want %v", res, err, tt.want)
				}
				evs, _ := s.snapshot()
				if len(evs) != tt.wantText {
					t.Errorf("%d events before the failure, want %d", len(evs), tt.wantText)
				}
				if d := time.Since(start); d != tt.wantAt {
					t.Errorf("failed at %v, want %v", d, tt.wantAt)
				}
			})
		})
	}
	a := adapter(t, `{"models":[{"name":"m","tokens":1,"fail":{"kind":"rate_limited","message":"slow down"}}]}`)
	_, err := a.Execute(t.Context(), run("m", "hi"), newSink())
	if !strings.Contains(err.Error(), "slow down") {
		t.Errorf("message lost: %v", err)
	}
}

func TestCancelDuringPrefillReturnsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := adapter(t, `{"models":[{"name":"m","prefill_delay":"1h"}]}`)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		_, err := a.Execute(ctx, run("m", "hi"), newSink())
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != time.Second {
			t.Errorf("err %v after %v", err, time.Since(start))
		}
	})
}

func TestUnknownTargetIsModelNotFound(t *testing.T) {
	a := simulator.New()
	if _, err := a.Execute(t.Context(), run("nope", "hi"), newSink()); !errors.Is(err, sdk.ErrModelNotFound) {
		t.Errorf("err = %v", err)
	}
	for target, want := range map[string]sdk.HealthStatus{simulator.DefaultModel: sdk.HealthAvailable, "nope": sdk.HealthUnavailable} {
		if h, _ := a.Probe(t.Context(), target); h.Status != want {
			t.Errorf("probe %s = %v, want %v", target, h.Status, want)
		}
	}
}

func TestConfigureIsStrict(t *testing.T) {
	tests := []struct {
		name, cfg string
		ok        bool
	}{
		{"empty", `{}`, true},
		{"full model", `{"models":[{"name":"m","tokens":4,"token_interval":"5ms","prefill_delay":"1s","stall_after":2,` +
			`"fail":{"kind":"internal","message":"x","after_tokens":1},"tool_call":{"name":"f","arguments":[1]},"reasoning":"r"}]}`, true},
		{"unknown top-level key", `{"modles":[]}`, false},
		{"unknown model key", `{"models":[{"name":"m","tokenz":3}]}`, false},
		{"unknown fail key", `{"models":[{"name":"m","fail":{"kind":"internal","after":1}}]}`, false},
		{"missing name", `{"models":[{"tokens":3}]}`, false},
		{"duplicate name", `{"models":[{"name":"m"},{"name":"m"}]}`, false},
		{"negative tokens", `{"models":[{"name":"m","tokens":-1}]}`, false},
		{"bad interval", `{"models":[{"name":"m","token_interval":"fast"}]}`, false},
		{"negative prefill", `{"models":[{"name":"m","prefill_delay":"-1s"}]}`, false},
		{"negative stall", `{"models":[{"name":"m","stall_after":-1}]}`, false},
		{"unknown fail kind", `{"models":[{"name":"m","fail":{"kind":"exploded"}}]}`, false},
		{"tool call without name", `{"models":[{"name":"m","tool_call":{"arguments":{}}}]}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := simulator.New().Configure(t.Context(), sdk.Config(tt.cfg))
			if tt.ok && err != nil {
				t.Errorf("rejected: %v", err)
			}
			if !tt.ok && !errors.Is(err, sdk.ErrInvalidRequest) {
				t.Errorf("err = %v, want invalid_request", err)
			}
		})
	}
}
