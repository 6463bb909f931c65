package ollama

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/sdk"
)

func TestExecuteStreamsTextInOrderThenUsage(t *testing.T) {
	m := fakeollama.Model{Name: "llama3.2", Seed: 7, TokenCount: 12, PromptEvalCount: 23}
	f := newFake(t, m)
	a := newAdapter(t, f.URL(), nil)
	var s sink
	res, err := a.Execute(ctxTimeout(t, 5*time.Second), userRun("llama3.2"), &s)
	if err != nil {
		t.Fatal(err)
	}
	evs := s.all()
	if len(evs) != 13 {
		t.Fatalf("%d events, want 12 text deltas and a usage", len(evs))
	}
	for i, tok := range m.Answer() {
		if evs[i].Kind != sdk.TextDelta || evs[i].Text != tok {
			t.Fatalf("event %d = %v %q, want text %q", i, evs[i].Kind, evs[i].Text, tok)
		}
	}
	last := evs[len(evs)-1]
	if last.Kind != sdk.UsageReport || last.Usage.PromptTokens != 23 || last.Usage.CompletionTokens != 12 {
		t.Fatalf("last event %+v", last)
	}
	u := res.Usage
	if res.DoneReason != "stop" || *u != *last.Usage || u.TotalDuration <= 0 || u.LoadDuration <= 0 ||
		u.PromptEvalDuration <= 0 || u.EvalDuration <= 0 {
		t.Fatalf("result %+v usage %+v", res, u)
	}
}

func TestExecuteThinkingComesAsReasoningBeforeText(t *testing.T) {
	m := fakeollama.Model{Name: "qwen3", Text: "It is 4.", Thinking: "Two plus two is four."}
	a := newAdapter(t, newFake(t, m).URL(), nil)
	think := true
	req := userRun("qwen3")
	req.Options.Think = &think
	var s sink
	if _, err := a.Execute(ctxTimeout(t, 5*time.Second), req, &s); err != nil {
		t.Fatal(err)
	}
	if s.text(sdk.ReasoningDelta) != m.Thinking || s.text(sdk.TextDelta) != m.Text {
		t.Fatalf("reasoning %q text %q", s.text(sdk.ReasoningDelta), s.text(sdk.TextDelta))
	}
	seenText := false
	for _, ev := range s.all() {
		seenText = seenText || ev.Kind == sdk.TextDelta
		if ev.Kind == sdk.ReasoningDelta && seenText {
			t.Fatal("reasoning after text")
		}
	}
}

func TestExecuteToolCallsAreWholeCallsWithIDs(t *testing.T) {
	for _, omitIDs := range []bool{false, true} {
		m := fakeollama.Model{Name: "llama3.2", Text: "Checking.", OmitToolCallIDs: omitIDs, ToolCalls: []fakeollama.ToolCall{
			{Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris", "unit": "c"}`)},
			{Name: "get_time", Arguments: json.RawMessage(`{"tz":"Europe/Paris"}`)},
		}}
		a := newAdapter(t, newFake(t, m).URL(), nil)
		req := userRun("llama3.2")
		req.Tools = []sdk.Tool{{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object"}`)}, {Name: "get_time"}}
		var s sink
		res, err := a.Execute(ctxTimeout(t, 5*time.Second), req, &s)
		if err != nil {
			t.Fatal(err)
		}
		calls := s.calls()
		if len(calls) != 2 || res.DoneReason != "tool_calls" {
			t.Fatalf("omitIDs=%v: calls %+v reason %q", omitIDs, calls, res.DoneReason)
		}
		for i, want := range []sdk.ToolCall{
			{Index: 0, Name: "get_weather", Arguments: `{"city":"Paris","unit":"c"}`},
			{Index: 1, Name: "get_time", Arguments: `{"tz":"Europe/Paris"}`},
		} {
			got := calls[i]
			if got.Index != want.Index || got.Name != want.Name || got.Arguments != want.Arguments {
				t.Errorf("omitIDs=%v: call %d = %+v", omitIDs, i, got)
			}
			wantID := "call_" + string(rune('0'+i))
			if omitIDs && got.ID != wantID || !omitIDs && (got.ID == wantID || !strings.HasPrefix(got.ID, "call_")) {
				t.Errorf("omitIDs=%v: call %d id %q", omitIDs, i, got.ID)
			}
		}
		if s.text(sdk.TextDelta) != "Checking." {
			t.Errorf("text %q", s.text(sdk.TextDelta))
		}
	}
}

// A completed run leaves its connection reusable: the next run does not
// pay for a new dial.
func TestExecuteReusesConnections(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "m", ToolCalls: []fakeollama.ToolCall{{Name: "f"}}})
	a := newAdapter(t, f.URL(), nil)
	for range 5 {
		if _, err := a.Execute(ctxTimeout(t, 5*time.Second), userRun("m"), &sink{}); err != nil {
			t.Fatal(err)
		}
	}
	reqs := f.Requests()
	for _, r := range reqs[1:] {
		if r.RemoteAddr != reqs[0].RemoteAddr {
			t.Fatalf("run over a new connection: %s then %s", reqs[0].RemoteAddr, r.RemoteAddr)
		}
	}
}

func TestExecuteMapsRequestAndOptions(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "llava:7b", Thinking: "ok"})
	a := newAdapter(t, f.URL(), map[string]any{
		"keep_alive": "-1",
		"headers":    map[string]string{"X-Proxy-Team": "ml"},
	})
	temp, topP, maxTok, seed, think := 0.2, 0.9, int64(64), int64(42), true
	req := &sdk.Request{
		Target: "llava:7b",
		Messages: []sdk.Message{
			{Role: "system", Content: "be brief"},
			{Role: "user", Content: "what is this?", Images: [][]byte{[]byte("PNGDATA")}},
			{Role: "assistant", Reasoning: "need the tool", ToolCalls: []sdk.ToolCall{{ID: "c1", Name: "lookup", Arguments: `{"q": "x"}`}}},
			{Role: "tool", ToolCallID: "c1", Content: "result"},
		},
		Tools: []sdk.Tool{{Name: "lookup", Description: "looks up", Parameters: json.RawMessage(`{"type":"object","properties":{"q":{"type":"string"}}}`)}},
		Options: sdk.Options{
			Temperature: &temp, TopP: &topP, MaxTokens: &maxTok, Seed: &seed, Stop: []string{"\n\n"},
			Format: json.RawMessage(`{"type":"object"}`), Think: &think,
			Extra: json.RawMessage(`{"num_ctx": 8192, "temperature": 1.5}`),
		},
		Credential: &sdk.Credential{Kind: "bearer", Secret: "s3cret"},
	}
	if _, err := a.Execute(ctxTimeout(t, 5*time.Second), req, &sink{}); err != nil {
		t.Fatal(err)
	}
	got := lastRequest(t, f)
	if got.Method != "POST" || got.Path != "/api/chat" || got.Header.Get("Authorization") != "Bearer s3cret" ||
		got.Header.Get("X-Proxy-Team") != "ml" || got.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("request %s %s %v", got.Method, got.Path, got.Header)
	}
	var body map[string]any
	if err := got.Decode(&body); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"model": "llava:7b", "stream": true, "think": true, "keep_alive": -1.0,
		"format": map[string]any{"type": "object"},
		"options": map[string]any{
			"temperature": 0.2, "top_p": 0.9, "num_predict": 64.0, "seed": 42.0,
			"stop": []any{"\n\n"}, "num_ctx": 8192.0,
		},
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{
			"name": "lookup", "description": "looks up",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}},
		}}},
		"messages": []any{
			map[string]any{"role": "system", "content": "be brief"},
			map[string]any{"role": "user", "content": "what is this?", "images": []any{"UE5HREFUQQ=="}},
			map[string]any{"role": "assistant", "content": "", "thinking": "need the tool", "tool_calls": []any{
				map[string]any{"id": "c1", "function": map[string]any{"index": 0.0, "name": "lookup", "arguments": map[string]any{"q": "x"}}},
			}},
			map[string]any{"role": "tool", "content": "result", "tool_name": "lookup", "tool_call_id": "c1"},
		},
	}
	gotJSON, _ := json.MarshalIndent(body, "", " ")
	wantJSON, _ := json.MarshalIndent(want, "", " ")
	if string(gotJSON) != string(wantJSON) {
		t.Fatalf("body:\n%s\nwant:\n%s", gotJSON, wantJSON)
	}
}

func TestExecuteWithoutCredentialSendsNoAuthorization(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "m"})
	a := newAdapter(t, f.URL(), nil)
	if _, err := a.Execute(ctxTimeout(t, 5*time.Second), userRun("m"), &sink{}); err != nil {
		t.Fatal(err)
	}
	got := lastRequest(t, f)
	if _, ok := got.Header["Authorization"]; ok {
		t.Fatalf("Authorization sent without a credential: %v", got.Header)
	}
	var body map[string]any
	_ = got.Decode(&body)
	for _, k := range []string{"options", "tools", "format", "think", "keep_alive"} {
		if _, ok := body[k]; ok {
			t.Errorf("%s sent though not asked for", k)
		}
	}
}

func TestExecuteMapsErrorsToKinds(t *testing.T) {
	f := newFake(t,
		fakeollama.Model{Name: "auth", FailStatus: 401, FailMessage: "unauthorized"},
		fakeollama.Model{Name: "busy", FailStatus: 429, FailMessage: "slow down"},
		fakeollama.Model{Name: "broken", FailStatus: 500, FailMessage: "llama runner process has terminated"},
		fakeollama.Model{Name: "full", FailStatus: 503, FailMessage: "server busy, please try again.  maximum pending requests exceeded"},
		fakeollama.Model{Name: "crash", TokenCount: 6, ErrorAfter: 3, ErrorMessage: "an error was encountered while running the model"},
		fakeollama.Model{Name: "cut", TokenCount: 3, EndWithoutDone: true},
	)
	cases := []struct {
		target    string
		kind      sdk.Kind
		status    int
		msg       string
		retryable bool
		events    int
	}{
		{"nope", sdk.KindModelNotFound, 404, `model "nope" not found, try pulling it first`, false, 0},
		{"auth", sdk.KindUnauthenticated, 401, "unauthorized", false, 0},
		{"busy", sdk.KindRateLimited, 429, "slow down", true, 0},
		{"broken", sdk.KindUpstream, 500, "llama runner process has terminated", false, 0},
		{"full", sdk.KindUnavailable, 503, "maximum pending requests exceeded", true, 0},
		{"crash", sdk.KindUpstream, 0, "an error was encountered while running the model", false, 3},
		{"cut", sdk.KindUpstream, 0, "ended without its done line", false, 3},
	}
	a := newAdapter(t, f.URL(), nil)
	for _, tc := range cases {
		var s sink
		_, err := a.Execute(ctxTimeout(t, 5*time.Second), userRun(tc.target), &s)
		var se *sdk.Error
		if !errors.As(err, &se) || se.Kind != tc.kind || se.UpstreamStatus != tc.status ||
			!strings.Contains(err.Error(), tc.msg) || se.Retryable != tc.retryable {
			t.Errorf("%s: err %v (%+v)", tc.target, err, se)
			continue
		}
		if !errors.Is(err, &sdk.Error{Kind: tc.kind}) {
			t.Errorf("%s: errors.Is(kind) fails", tc.target)
		}
		if len(s.all()) != tc.events {
			t.Errorf("%s: %d events before the error, want %d", tc.target, len(s.all()), tc.events)
		}
	}
}

func TestExecuteConnectionRefusedIsUnavailable(t *testing.T) {
	f := fakeollama.New()
	url := f.URL()
	f.Close()
	a := newAdapter(t, url, nil)
	_, err := a.Execute(ctxTimeout(t, 5*time.Second), userRun("m"), &sink{})
	if !errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("err %v", err)
	}
}

func TestExecuteNotOllamaIs404WithoutModelNotFound(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	a := newAdapter(t, srv.URL, nil)
	_, err := a.Execute(ctxTimeout(t, 5*time.Second), userRun("m"), &sink{})
	if sdk.KindOf(err) != sdk.KindUpstream || !strings.Contains(err.Error(), "is base_url an Ollama server") {
		t.Fatalf("err %v", err)
	}
}

func TestExecuteCancelMidStreamDisconnectsUpstreamPromptly(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "m", TokenCount: 1000, TokenDelay: 20 * time.Millisecond})
	a := newAdapter(t, f.URL(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cancelled time.Time
	s := &sink{onEvent: func(sdk.Event) {
		if cancelled.IsZero() {
			cancelled = time.Now()
			cancel()
		}
	}}
	_, err := a.Execute(ctx, userRun("m"), s)
	returned := time.Since(cancelled)
	if !errors.Is(err, context.Canceled) && !errors.Is(err, sdk.ErrHostGone) {
		t.Fatalf("err %v", err)
	}
	if returned > 200*time.Millisecond {
		t.Fatalf("Execute returned %v after the cancel", returned)
	}
	gone, err := f.WaitForDisconnect(ctxTimeout(t, 2*time.Second), lastRequest(t, f).ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := gone.Sub(cancelled); d > 100*time.Millisecond {
		t.Fatalf("the fake saw the disconnect %v after the cancel", d)
	}
}

func TestExecuteCancelDuringStallReturnsCtxError(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "m", TokenCount: 5, Stall: true, StallAfter: 2})
	a := newAdapter(t, f.URL(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := 0
	s := &sink{onEvent: func(sdk.Event) {
		if events++; events == 2 {
			time.AfterFunc(50*time.Millisecond, cancel)
		}
	}}
	_, err := a.Execute(ctx, userRun("m"), s)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	if _, err := f.WaitForDisconnect(ctxTimeout(t, time.Second), lastRequest(t, f).ID); err != nil {
		t.Fatal(err)
	}
}

func TestExecuteStopsWhenHostIsGone(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "m", TokenCount: 50, TokenDelay: 5 * time.Millisecond})
	a := newAdapter(t, f.URL(), nil)
	s := &sink{err: sdk.ErrHostGone}
	_, err := a.Execute(ctxTimeout(t, 5*time.Second), userRun("m"), s)
	if !errors.Is(err, sdk.ErrHostGone) || len(s.all()) != 1 {
		t.Fatalf("err %v after %d events", err, len(s.all()))
	}
	if _, err := f.WaitForDisconnect(ctxTimeout(t, time.Second), lastRequest(t, f).ID); err != nil {
		t.Fatal(err)
	}
}

func TestExecuteRejectsOverlongLine(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"message":{"content":"`))
		_, _ = w.Write([]byte(strings.Repeat("a", MaxLineBytes)))
		_, _ = w.Write([]byte("\"}}\n"))
	}))
	defer srv.Close()
	a := newAdapter(t, srv.URL, nil)
	_, err := a.Execute(ctxTimeout(t, 10*time.Second), userRun("m"), &sink{})
	if sdk.KindOf(err) != sdk.KindUpstream || !strings.Contains(err.Error(), "exceeds 16 MiB") {
		t.Fatalf("err %v", err)
	}
}

func TestExecuteRejectsBadInput(t *testing.T) {
	a := newAdapter(t, "http://127.0.0.1:1", nil)
	bad := []*sdk.Request{
		{Messages: []sdk.Message{{Role: "user", Content: "x"}}},
		{Target: "m", Messages: []sdk.Message{{Role: "assistant", ToolCalls: []sdk.ToolCall{{Name: "f", Arguments: "[1]"}}}}},
		{Target: "m", Options: sdk.Options{Extra: json.RawMessage(`[1]`)}},
		{Target: "m", Options: sdk.Options{Format: json.RawMessage(`{nope`)}},
		{Target: "m", Credential: &sdk.Credential{Kind: "basic", Secret: "x"}},
	}
	for i, req := range bad {
		if _, err := a.Execute(ctxTimeout(t, time.Second), req, &sink{}); !errors.Is(err, sdk.ErrInvalidRequest) {
			t.Errorf("case %d: err %v", i, err)
		}
	}
}
