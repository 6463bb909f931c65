package fakeollama

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
)

// client returns the official Ollama Go client pointed at s: the fake's
// shapes are right when it decodes them.
func client(t *testing.T, s *Server) *api.Client {
	t.Helper()
	u, err := url.Parse(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	return api.NewClient(u, http.DefaultClient)
}

func newServer(t *testing.T, models ...Model) *Server {
	t.Helper()
	s := New(models...)
	t.Cleanup(s.Close)
	return s
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func weatherTool() api.Tool {
	props := api.NewToolPropertiesMap()
	props.Set("city", api.ToolProperty{Type: api.PropertyType{"string"}})
	return api.Tool{Type: "function", Function: api.ToolFunction{
		Name:       "get_weather",
		Parameters: api.ToolFunctionParameters{Type: "object", Required: []string{"city"}, Properties: props},
	}}
}

func TestChatStreamWithThinkingToolCallsAndUsage(t *testing.T) {
	m := Model{
		Name:            "qwen3",
		Text:            "Let me check.",
		Thinking:        "The user wants weather.",
		ToolCalls:       []ToolCall{{Name: "get_weather", Arguments: json.RawMessage(`{"city":"Paris","days":2}`)}},
		PromptEvalCount: 17,
	}
	s := newServer(t, m)
	var got []api.ChatResponse
	err := client(t, s).Chat(ctxTimeout(t, 5*time.Second), &api.ChatRequest{
		Model:    "qwen3",
		Messages: []api.Message{{Role: "user", Content: "weather in Paris?"}},
		Tools:    api.Tools{weatherTool()},
		Think:    &api.ThinkValue{Value: true},
	}, func(r api.ChatResponse) error { got = append(got, r); return nil })
	if err != nil {
		t.Fatal(err)
	}

	var thinking, content strings.Builder
	var calls []api.ToolCall
	sawContent := false
	for _, r := range got[:len(got)-1] {
		if r.Done || r.Model != "qwen3" || r.CreatedAt.IsZero() || r.Message.Role != "assistant" {
			t.Fatalf("bad line %+v", r)
		}
		if r.Message.Thinking != "" && sawContent {
			t.Fatal("thinking after content")
		}
		sawContent = sawContent || r.Message.Content != ""
		thinking.WriteString(r.Message.Thinking)
		content.WriteString(r.Message.Content)
		calls = append(calls, r.Message.ToolCalls...)
	}
	if thinking.String() != m.Thinking || content.String() != m.Text {
		t.Fatalf("thinking %q content %q", thinking.String(), content.String())
	}
	if len(calls) != 1 || calls[0].Function.Name != "get_weather" || !strings.HasPrefix(calls[0].ID, "call_") {
		t.Fatalf("calls %+v", calls)
	}
	if city, _ := calls[0].Function.Arguments.Get("city"); city != "Paris" {
		t.Fatalf("arguments %s", calls[0].Function.Arguments.String())
	}
	if calls[0].Function.Arguments.String() != `{"city":"Paris","days":2}` {
		t.Fatalf("argument order lost: %s", calls[0].Function.Arguments.String())
	}

	final := got[len(got)-1]
	if !final.Done || final.DoneReason != "stop" {
		t.Fatalf("final %+v", final)
	}
	wantEvals := len(m.ThinkingTokens()) + len(m.Answer()) + 1
	if final.PromptEvalCount != 17 || final.EvalCount != wantEvals {
		t.Fatalf("counts prompt %d eval %d, want 17 %d", final.PromptEvalCount, final.EvalCount, wantEvals)
	}
	if final.TotalDuration <= 0 || final.LoadDuration <= 0 || final.PromptEvalDuration <= 0 || final.EvalDuration <= 0 {
		t.Fatalf("durations %+v", final.Metrics)
	}
}

func TestChatWithoutToolsOrThinkingAnswersText(t *testing.T) {
	m := Model{Name: "m", Seed: 42, TokenCount: 5, Thinking: "hmm", ToolCalls: []ToolCall{{Name: "x"}}}
	s := newServer(t, m)
	var content strings.Builder
	var final api.ChatResponse
	err := client(t, s).Chat(ctxTimeout(t, 5*time.Second), &api.ChatRequest{
		Model: "m", Messages: []api.Message{{Role: "user", Content: "hi"}}, Think: &api.ThinkValue{Value: false},
	}, func(r api.ChatResponse) error {
		if r.Message.Thinking != "" || len(r.Message.ToolCalls) > 0 {
			t.Errorf("unexpected line %+v", r)
		}
		content.WriteString(r.Message.Content)
		final = r
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if content.String() != m.AnswerText() || len(m.Answer()) != 5 || final.EvalCount != 5 {
		t.Fatalf("content %q (want %q), eval %d", content.String(), m.AnswerText(), final.EvalCount)
	}
	if (Model{Name: "m", Seed: 42, TokenCount: 5}).AnswerText() != m.AnswerText() {
		t.Fatal("seeded answer is not deterministic")
	}
}

func TestChatNonStreaming(t *testing.T) {
	m := Model{Name: "m", Text: "one two three"}
	s := newServer(t, m)
	stream := false
	n := 0
	err := client(t, s).Chat(ctxTimeout(t, 5*time.Second), &api.ChatRequest{
		Model: "m", Messages: []api.Message{{Role: "user", Content: "hi"}}, Stream: &stream,
	}, func(r api.ChatResponse) error {
		n++
		if !r.Done || r.Message.Content != "one two three" || r.EvalCount != 3 {
			t.Errorf("answer %+v", r)
		}
		return nil
	})
	if err != nil || n != 1 {
		t.Fatalf("err %v, %d answers", err, n)
	}
	reqs := s.Requests()
	if got := reqs[len(reqs)-1].Header.Get("Content-Type"); got != "application/json" {
		t.Fatalf("recorded request content type %q", got)
	}
}

func TestChatNumPredictStopsWithLength(t *testing.T) {
	s := newServer(t, Model{Name: "m", TokenCount: 10})
	var final api.ChatResponse
	err := client(t, s).Chat(ctxTimeout(t, 5*time.Second), &api.ChatRequest{
		Model: "m", Messages: []api.Message{{Role: "user", Content: "hi"}},
		Options: map[string]any{"num_predict": 3},
	}, func(r api.ChatResponse) error { final = r; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if final.DoneReason != "length" || final.EvalCount != 3 {
		t.Fatalf("final %+v", final)
	}
}

func TestUnknownModelIsA404WithOllamasMessage(t *testing.T) {
	s := newServer(t, Model{Name: "llama3.2"})
	err := client(t, s).Chat(ctxTimeout(t, 5*time.Second), &api.ChatRequest{
		Model: "nope", Messages: []api.Message{{Role: "user", Content: "hi"}},
	}, func(api.ChatResponse) error { return nil })
	var se api.StatusError
	if !errors.As(err, &se) || se.StatusCode != 404 {
		t.Fatalf("err %v (%T)", err, err)
	}
	if se.ErrorMessage != `model "nope" not found, try pulling it first` || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("message %q", se.ErrorMessage)
	}
}

func TestFailStatusAndThinkRefusal(t *testing.T) {
	s := newServer(t,
		Model{Name: "busy", FailStatus: 429, FailMessage: "too many requests"},
		Model{Name: "plain"},
	)
	c := client(t, s)
	cases := []struct {
		model  string
		think  *api.ThinkValue
		status int
		msg    string
	}{
		{"busy", nil, 429, "too many requests"},
		{"plain", &api.ThinkValue{Value: true}, 400, `"plain" does not support thinking`},
	}
	for _, tc := range cases {
		err := c.Chat(ctxTimeout(t, 5*time.Second), &api.ChatRequest{
			Model: tc.model, Messages: []api.Message{{Role: "user", Content: "hi"}}, Think: tc.think,
		}, func(api.ChatResponse) error { return nil })
		var se api.StatusError
		if !errors.As(err, &se) || se.StatusCode != tc.status || se.ErrorMessage != tc.msg {
			t.Errorf("%s: err %v", tc.model, err)
		}
	}
}

func TestMidStreamErrorLineReachesTheClient(t *testing.T) {
	s := newServer(t, Model{Name: "m", TokenCount: 5, ErrorAfter: 2, ErrorMessage: "runner crashed"})
	lines := 0
	err := client(t, s).Chat(ctxTimeout(t, 5*time.Second), &api.ChatRequest{
		Model: "m", Messages: []api.Message{{Role: "user", Content: "hi"}},
	}, func(api.ChatResponse) error { lines++; return nil })
	if err == nil || err.Error() != "runner crashed" || lines != 2 {
		t.Fatalf("err %v after %d lines", err, lines)
	}
	reqs := s.Requests()
	if !strings.HasSuffix(string(reqs[0].Response), "{\"error\":\"runner crashed\"}\n") {
		t.Fatalf("response %q", reqs[0].Response)
	}
}

func TestTagsShowPsVersionEmbedGenerate(t *testing.T) {
	s := newServer(t,
		Model{Name: "llama3.2", Family: "llama", ParameterSize: "3.2B"},
		Model{Name: "nomic-embed-text:v1.5", EmbeddingDims: 16},
	)
	c := client(t, s)
	ctx := ctxTimeout(t, 5*time.Second)

	if err := c.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Models) != 2 || list.Models[0].Name != "llama3.2:latest" || list.Models[1].Name != "nomic-embed-text:v1.5" ||
		list.Models[0].Details.ParameterSize != "3.2B" || list.Models[0].Digest == "" || list.Models[0].Size == 0 {
		t.Fatalf("tags %+v", list.Models)
	}

	show, err := c.Show(ctx, &api.ShowRequest{Model: "llama3.2"})
	if err != nil || show.Details.Family != "llama" || len(show.Capabilities) == 0 {
		t.Fatalf("show %+v %v", show, err)
	}
	if _, err := c.Show(ctx, &api.ShowRequest{Model: "nope"}); err == nil || !strings.Contains(err.Error(), "model 'nope' not found") {
		t.Fatalf("show nope: %v", err)
	}

	var text strings.Builder
	var final api.GenerateResponse
	err = c.Generate(ctx, &api.GenerateRequest{Model: "llama3.2", Prompt: "say"}, func(r api.GenerateResponse) error {
		text.WriteString(r.Response)
		final = r
		return nil
	})
	want := Model{Name: "llama3.2"}.AnswerText()
	if err != nil || text.String() != want || !final.Done || final.DoneReason != "stop" || len(final.Context) == 0 || final.EvalCount != 8 {
		t.Fatalf("generate %q %+v %v", text.String(), final, err)
	}
	err = c.Generate(ctx, &api.GenerateRequest{Model: "llama3.2"}, func(r api.GenerateResponse) error {
		final = r
		return nil
	})
	if err != nil || final.DoneReason != "load" || !final.Done {
		t.Fatalf("load %+v %v", final, err)
	}

	emb, err := c.Embed(ctx, &api.EmbedRequest{Model: "nomic-embed-text:v1.5", Input: []string{"a", "b"}})
	if err != nil || len(emb.Embeddings) != 2 || len(emb.Embeddings[0]) != 16 || emb.PromptEvalCount != 2 {
		t.Fatalf("embed %+v %v", emb, err)
	}

	ps, err := c.ListRunning(ctx)
	if err != nil || len(ps.Models) != 2 || ps.Models[0].ExpiresAt.Before(time.Now()) {
		t.Fatalf("ps %+v %v", ps, err)
	}
	v, err := c.Version(ctx)
	if err != nil || v != ServerVersion {
		t.Fatalf("version %q %v", v, err)
	}
}

// Issue 12: embed's dimensions shorten the vectors (normalized again), and
// a generate with a suffix fills in the middle, or is refused with
// Ollama's 400 for a model without it; checked with the official client.
func TestEmbedDimensionsAndGenerateWithASuffix(t *testing.T) {
	s := newServer(t, Model{Name: "coder", Text: "return a + b"}, Model{Name: "plain", NoInsert: true},
		Model{Name: "embed", EmbeddingDims: 16})
	c := client(t, s)
	ctx := ctxTimeout(t, 5*time.Second)

	legacy, err := c.Embeddings(ctx, &api.EmbeddingRequest{Model: "embed", Prompt: "a"})
	if err != nil || len(legacy.Embedding) != 16 {
		t.Fatalf("legacy embeddings %+v %v", legacy, err)
	}
	emb, err := c.Embed(ctx, &api.EmbedRequest{Model: "embed", Input: "a", Dimensions: 4})
	if err != nil || len(emb.Embeddings) != 1 || len(emb.Embeddings[0]) != 4 {
		t.Fatalf("embed %+v %v", emb, err)
	}
	var norm float64
	for _, v := range emb.Embeddings[0] {
		norm += float64(v) * float64(v)
	}
	if norm < 0.999 || norm > 1.001 {
		t.Errorf("a shortened vector of length² %v, want a unit vector", norm)
	}

	var text strings.Builder
	err = c.Generate(ctx, &api.GenerateRequest{Model: "coder", Prompt: "def add(a, b):\n    ", Suffix: "\n\nprint(add(1, 2))"},
		func(r api.GenerateResponse) error { text.WriteString(r.Response); return nil })
	if err != nil || text.String() != "return a + b" {
		t.Fatalf("generate with a suffix: %q, %v", text.String(), err)
	}
	var got GenerateRequest
	reqs := s.Requests()
	if err := json.Unmarshal(reqs[len(reqs)-1].Body, &got); err != nil || got.Suffix != "\n\nprint(add(1, 2))" {
		t.Errorf("recorded %+v, %v", got, err)
	}
	err = c.Generate(ctx, &api.GenerateRequest{Model: "plain", Prompt: "x", Suffix: "y"}, func(api.GenerateResponse) error { return nil })
	var se api.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusBadRequest || se.ErrorMessage != "does not support insert" {
		t.Errorf("a suffix on a model without insert: %v", err)
	}
}

// The fake counts the generation requests it answers at once, and their
// peak, for tests that bound a Node's concurrency where the work lands.
func TestTheFakeCountsConcurrentGenerations(t *testing.T) {
	s := New(Model{Name: "slow:latest", Text: "a b c", TokenDelay: time.Second})
	t.Cleanup(s.Close)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			resp, err := http.Post(s.URL()+"/api/generate", "application/json", strings.NewReader(`{"model":"slow","prompt":"hi"}`))
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Concurrency().Now < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	if c := s.Concurrency(); c.Now != 0 || c.Max != 3 {
		t.Errorf("concurrency %+v, want none now and 3 at most", c)
	}
}
