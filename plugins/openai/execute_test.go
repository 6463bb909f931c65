package openai_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
	"github.com/iop-dev/iop/sdk"
)

func TestExecuteStreamsEventsInArrivalOrder(t *testing.T) {
	s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{
		Name:      "m",
		Reasoning: []string{"Hmm", "..."},
		Tokens:    []string{"Hel", "lo"},
		ToolCalls: []fakeopenai.ToolCall{{ID: "call_a", Name: "get_weather", Arguments: `{"city":"Seoul"}`, FragmentSize: 8}},
		Usage:     &fakeopenai.Usage{PromptTokens: 5, CompletionTokens: 9},
	}}})
	a := configured(t, s.BaseURL())
	var out sink
	res, err := a.Execute(t.Context(), userRun("m", "hi"), &out)
	if err != nil {
		t.Fatal(err)
	}
	want := `r:Hmm r:... t:Hel t:lo c0:call_a/get_weather/ c0://{"city": c0://"Seoul"} u:5/9`
	if got := summary(out.all()); got != want {
		t.Errorf("events\n got %s\nwant %s", got, want)
	}
	if res.DoneReason != "tool_calls" || res.Usage == nil || res.Usage.PromptTokens != 5 || res.Usage.CompletionTokens != 9 {
		t.Errorf("result = %+v usage %+v", res, res.Usage)
	}
}

func TestToolCallFragmentsConcatenateToFullArguments(t *testing.T) {
	calls := []fakeopenai.ToolCall{
		{ID: "call_1", Name: "search", Arguments: `{"query":"quic flow control","limit":5}`},
		{ID: "call_2", Name: "fetch", Arguments: `{"url":"https://example.com/a?b=c","headers":{"x":"y"}}`},
	}
	for _, size := range []int{1, 3, 7, 1000} {
		t.Run(fmt.Sprintf("fragment size %d", size), func(t *testing.T) {
			cs := append([]fakeopenai.ToolCall(nil), calls...)
			for i := range cs {
				cs[i].FragmentSize = size
			}
			s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m", Tokens: []string{}, ToolCalls: cs}}})
			var out sink
			res, err := configured(t, s.BaseURL()).Execute(t.Context(), userRun("m", "go"), &out)
			if err != nil {
				t.Fatal(err)
			}
			got := assembled(out.all())
			if len(got) != 2 {
				t.Fatalf("assembled %d calls: %+v", len(got), got)
			}
			for i, c := range calls {
				g := got[i]
				if g.ID != c.ID || g.Name != c.Name || g.Arguments != c.Arguments {
					t.Errorf("call %d = %+v, want id %s name %s args %s", i, g, c.ID, c.Name, c.Arguments)
				}
			}
			if res.DoneReason != "tool_calls" {
				t.Errorf("done reason %q", res.DoneReason)
			}
		})
	}
}

func TestUsageAndFinishReasonReachTheResult(t *testing.T) {
	tests := []struct {
		name       string
		model      fakeopenai.Model
		wantReason string
		wantUsage  string // "" for none
	}{
		{"stop with counted usage", fakeopenai.Model{Name: "m", TokenCount: 3}, "stop", "u:1/3"},
		{"length", fakeopenai.Model{Name: "m", FinishReason: "length", Usage: &fakeopenai.Usage{PromptTokens: 7, CompletionTokens: 2}}, "length", "u:7/2"},
		{"server without usage", fakeopenai.Model{Name: "m", NoUsage: true}, "stop", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{tt.model}})
			var out sink
			res, err := configured(t, s.BaseURL()).Execute(t.Context(), userRun("m", "hi"), &out)
			if err != nil {
				t.Fatal(err)
			}
			if res.DoneReason != tt.wantReason {
				t.Errorf("done reason %q, want %q", res.DoneReason, tt.wantReason)
			}
			var usage []string
			for _, ev := range out.all() {
				if ev.Kind == sdk.UsageReport {
					usage = append(usage, summary([]sdk.Event{ev}))
				}
			}
			if tt.wantUsage == "" {
				if res.Usage != nil || len(usage) != 0 {
					t.Errorf("usage %+v, events %v: want none", res.Usage, usage)
				}
				return
			}
			if len(usage) != 1 || usage[0] != tt.wantUsage {
				t.Errorf("usage events %v, want [%s]", usage, tt.wantUsage)
			}
			if got := summary([]sdk.Event{{Kind: sdk.UsageReport, Usage: res.Usage}}); got != tt.wantUsage {
				t.Errorf("result usage %s, want %s", got, tt.wantUsage)
			}
		})
	}
}

// rawServer serves body as a 200 event stream, for shapes the fake does not
// produce.
func rawServer(t *testing.T, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

func TestUpstreamErrorsMapToKinds(t *testing.T) {
	fail := func(status int, msg string) fakeopenai.Config {
		return fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m", Fail: &fakeopenai.Failure{Status: status, Message: msg}}}}
	}
	refused := httptest.NewServer(http.NotFoundHandler())
	refusedURL := refused.URL + "/v1"
	refused.Close()

	tests := []struct {
		name     string
		baseURL  func(t *testing.T) string
		target   string
		want     *sdk.Error
		wantMsg  string
		retrying bool
	}{
		{"401 without key", fakeURL(fakeopenai.Config{APIKey: "k", Models: []fakeopenai.Model{{Name: "m"}}}), "m", sdk.ErrUnauthenticated, "didn't provide an API key", false},
		{"404 unknown model", fakeURL(fakeopenai.Config{}), "nope", sdk.ErrModelNotFound, "`nope` does not exist", false},
		{"429", fakeURL(fail(429, "Rate limit reached")), "m", sdk.ErrRateLimited, "Rate limit reached", true},
		{"500", fakeURL(fail(500, "internal boom")), "m", sdk.ErrUpstream, "internal boom", false},
		{"503", fakeURL(fail(503, "overloaded")), "m", sdk.ErrUnavailable, "overloaded", true},
		{"400", fakeURL(fail(400, "bad temperature")), "m", sdk.ErrInvalidRequest, "bad temperature", false},
		{"connection refused", func(*testing.T) string { return refusedURL }, "m", sdk.ErrUnavailable, "connection refused", true},
		{"error object mid-stream", fakeURL(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "m", Fail: &fakeopenai.Failure{
			MidStream: true, AfterChunks: 2, Message: "engine died"}}}}), "m", sdk.ErrUpstream, "engine died", false},
		{"error event mid-stream", rawFn("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\nevent: error\ndata: {\"message\":\"oops\"}\n\n"), "m", sdk.ErrUpstream, "oops", false},
		{"malformed chunk", rawFn("data: {\"choices\":[\n\n"), "m", sdk.ErrUpstream, "malformed chunk", false},
		{"stream cut before the end", rawFn("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n"), "m", sdk.ErrUnavailable, "ended before", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out sink
			res, err := configured(t, tt.baseURL(t)).Execute(t.Context(), userRun(tt.target, "hi"), &out)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v (result %+v), want kind %v", err, res, tt.want.Kind)
			}
			var e *sdk.Error
			errors.As(err, &e)
			if !strings.Contains(e.Message, tt.wantMsg) {
				t.Errorf("message %q does not carry %q", e.Message, tt.wantMsg)
			}
			if e.Retryable != tt.retrying {
				t.Errorf("retryable = %v, want %v", e.Retryable, tt.retrying)
			}
		})
	}
}

func fakeURL(cfg fakeopenai.Config) func(t *testing.T) string {
	return func(t *testing.T) string { return startFake(t, cfg).BaseURL() }
}

func rawFn(body string) func(t *testing.T) string {
	return func(t *testing.T) string { return rawServer(t, body) }
}

func TestCancelReachesServerAsDisconnectPromptly(t *testing.T) {
	tests := []struct {
		name   string
		model  fakeopenai.Model
		cancel func(context.CancelFunc, *sink)
		want   error
	}{
		{"run context cancelled during a stall", fakeopenai.Model{Name: "m", Stall: true, StallAfter: 2},
			func(c context.CancelFunc, _ *sink) { c() }, context.Canceled},
		{"run context cancelled during prefill", fakeopenai.Model{Name: "m", Stall: true},
			func(c context.CancelFunc, _ *sink) { c() }, context.Canceled},
		{"run context cancelled before the headers", fakeopenai.Model{Name: "m", HeaderDelay: time.Hour},
			func(c context.CancelFunc, _ *sink) { c() }, context.Canceled},
		{"host gone while streaming", fakeopenai.Model{Name: "m", TokenCount: 1000, Delay: 5 * time.Millisecond},
			func(_ context.CancelFunc, s *sink) {
				s.mu.Lock()
				s.goneAfter = 2
				s.mu.Unlock()
			}, sdk.ErrHostGone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{tt.model}})
			a := configured(t, s.BaseURL())
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			out := &sink{arrived: make(chan struct{}, 1)}
			errc := make(chan error, 1)
			go func() {
				_, err := a.Execute(ctx, userRun("m", "hi"), out)
				errc <- err
			}()
			wait, stop := context.WithTimeout(t.Context(), 5*time.Second)
			defer stop()
			if _, err := s.Wait(wait, func(rs []fakeopenai.Request) bool { return len(rs) == 1 }); err != nil {
				t.Fatal("request never reached the server")
			}
			for len(out.all()) < min(tt.model.StallAfter, 2) {
				<-out.arrived
			}
			cancelled := time.Now()
			tt.cancel(cancel, out)
			select {
			case err := <-errc:
				if !errors.Is(err, tt.want) {
					t.Errorf("Execute returned %v, want %v", err, tt.want)
				}
			case <-wait.Done():
				t.Fatal("Execute did not return after the cancel")
			}
			req, err := s.WaitGone(wait, 1)
			if err != nil {
				t.Fatal("the server never saw the client leave")
			}
			if d := req.GoneAt.Sub(cancelled); d > time.Second {
				t.Errorf("server saw the client leave %v after the cancel", d)
			}
		})
	}
}
