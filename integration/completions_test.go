package integration

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"
)

// Text completions (POST /v1/completions, issue 12) with the official
// OpenAI SDK on the kinds stack (embed_test.go): a raw completion run on
// each adapter, each calling its server's own completion (SPEC R2, P2).

// completionParams is a fill-in-the-middle request for model.
func completionParams(model string) openai.CompletionNewParams {
	return openai.CompletionNewParams{
		Model:  openai.CompletionNewParamsModel(model),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("def add(a, b):\n    ")},
		Suffix: openai.String("\n\nprint(add(1, 2))"),
	}
}

// P2, R2, issue 12: the official SDK's Completions, whole and streamed
// with usage, on each adapter: the prompt and the suffix reach the model
// server's own completion (Ollama's /api/generate, the OpenAI-compatible
// /v1/completions), and its text comes back with the finish reason and
// the usage.
func TestOfficialClientCompletionsOnEveryAdapter(t *testing.T) {
	s := startKindsStack(t)
	c := sdkClient(s.base)
	for _, m := range []struct {
		model, answer string
		suffixSeen    func() any // the suffix the model server got
	}{
		{"coder", "return a + b", func() any { return lastBody(t, s.ollama.Requests(), "/api/generate")["suffix"] }},
		{"oa-coder", "return a + b", func() any { return lastBody(t, s.compat.Requests(), "/v1/completions")["suffix"] }},
		{"sim-coder", "", nil},
	} {
		t.Run(m.model, func(t *testing.T) {
			res, err := c.Completions.New(t.Context(), completionParams(m.model))
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Choices) != 1 || res.Choices[0].Text == "" || res.Choices[0].FinishReason != openai.CompletionChoiceFinishReasonStop ||
				res.Object != "text_completion" || res.Usage.CompletionTokens == 0 || res.Usage.TotalTokens != res.Usage.PromptTokens+res.Usage.CompletionTokens {
				t.Fatalf("answer %s", res.RawJSON())
			}
			whole := res.Choices[0].Text
			if m.answer != "" && whole != m.answer {
				t.Errorf("text %q, want %q", whole, m.answer)
			}
			if m.suffixSeen != nil {
				if got := m.suffixSeen(); got != "\n\nprint(add(1, 2))" {
					t.Errorf("the model server got suffix %q", got)
				}
			}

			p := completionParams(m.model)
			p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			stream := c.Completions.NewStreaming(t.Context(), p)
			var text strings.Builder
			var finish string
			var usage int64
			chunks := 0
			for stream.Next() {
				chunk := stream.Current()
				chunks++
				for _, ch := range chunk.Choices {
					text.WriteString(ch.Text)
					if ch.FinishReason != "" {
						finish = string(ch.FinishReason)
					}
				}
				usage += chunk.Usage.CompletionTokens
			}
			if err := stream.Err(); err != nil || text.String() != whole || finish != "stop" || usage == 0 || chunks < 3 {
				t.Errorf("stream: %q in %d chunks, finish %q, usage %d, %v; want %q", text.String(), chunks, finish, usage, err, whole)
			}
		})
	}
}

// P1, P2, issue 12: what goes wrong reaches the SDK as its own error, on
// each adapter: an unknown model is a 404 model_not_found; a suffix on a
// model that cannot fill in the middle a 400 unsupported (Ollama's "does
// not support insert", vLLM's "suffix is not currently supported"); a
// failure after text has streamed the stream's error, after the text; a
// refusal (compat's one slot busy) a 429 queue_full.
func TestOfficialClientCompletionErrors(t *testing.T) {
	s := startKindsStack(t)
	c := sdkClient(s.base)
	var apiErr *openai.Error
	_, err := c.Completions.New(t.Context(), completionParams("no-such-model"))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Errorf("unknown model: %v", err)
	}
	unknown := c.Completions.NewStreaming(t.Context(), completionParams("no-such-model"))
	for unknown.Next() {
		t.Error("a chunk of an unknown model")
	}
	if !errors.As(unknown.Err(), &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("unknown model, streamed: %v", unknown.Err())
	}

	for _, model := range []string{"plain", "oa-plain"} {
		_, err := c.Completions.New(t.Context(), completionParams(model))
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Code != "unsupported" {
			t.Errorf("%s, a suffix without fill-in-the-middle: %v", model, err)
		}
		p := completionParams(model)
		p.Suffix = openai.String("")
		if _, err := c.Completions.New(t.Context(), p); err != nil {
			t.Errorf("%s without a suffix: %v", model, err)
		}
	}

	for _, m := range []struct{ model, says string }{{"crashy", "runner crashed"}, {"oa-flaky", "engine died"}} {
		p := completionParams(m.model)
		p.Suffix = openai.String("")
		stream := c.Completions.NewStreaming(t.Context(), p)
		var text strings.Builder
		for stream.Next() {
			for _, ch := range stream.Current().Choices {
				text.WriteString(ch.Text)
			}
		}
		var se *ssestream.StreamError
		if text.Len() == 0 || !errors.As(stream.Err(), &se) || !strings.Contains(se.Error(), m.says) {
			t.Errorf("%s, a failure mid-stream: text %q, error %v", m.model, text.String(), stream.Err())
		}
		_, err := c.Completions.New(t.Context(), p)
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadGateway || !strings.Contains(apiErr.Message, m.says) {
			t.Errorf("%s, a failure, not streamed: %v", m.model, err)
		}
	}

	done := make(chan error, 1)
	go func() {
		_, err := c.Completions.New(t.Context(), completionParams("oa-slow"))
		done <- err
	}()
	waitFor(t, "the first completion holding compat's slot", func() bool { return queuedOrRunning(t, s.base) == 1 })
	busy := c.Completions.NewStreaming(t.Context(), completionParams("oa-slow"))
	for busy.Next() {
		t.Error("a chunk of a refused request")
	}
	if !errors.As(busy.Err(), &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "queue_full" ||
		apiErr.Response.Header.Get("X-Iop-Refusal") != "queue_full" {
		t.Errorf("refusal: %v", busy.Err())
	}
	if err := <-done; err != nil {
		t.Errorf("the completion holding the slot: %v", err)
	}
}

// P2, issue 12: the official Ollama client's Generate with a suffix on each
// adapter: tunnelled to the fake Ollama, and a raw completion run on the
// fake OpenAI server (its /v1/completions with the suffix) and the
// simulator; a model that cannot fill in the middle is Ollama's 400.
func TestOllamaClientGenerateWithASuffixOnEveryAdapter(t *testing.T) {
	s := startKindsStack(t)
	c := ollamaClient(t, s.base)
	for _, m := range []struct{ model, answer string }{{"coder", "return a + b"}, {"oa-coder", "return a + b"}, {"sim-coder", ""}} {
		var text strings.Builder
		var last api.GenerateResponse
		err := c.Generate(t.Context(), &api.GenerateRequest{Model: m.model, Prompt: "def add(a, b):\n    ", Suffix: "\n\nprint(add(1, 2))"},
			func(r api.GenerateResponse) error { text.WriteString(r.Response); last = r; return nil })
		if err != nil || text.Len() == 0 || !last.Done || (m.answer != "" && text.String() != m.answer) {
			t.Errorf("%s: %q, last %+v, %v", m.model, text.String(), last, err)
		}
	}
	if got := lastBody(t, s.compat.Requests(), "/v1/completions")["suffix"]; got != "\n\nprint(add(1, 2))" {
		t.Errorf("the OpenAI-compatible server got suffix %q", got)
	}
	err := c.Generate(t.Context(), &api.GenerateRequest{Model: "oa-plain", Prompt: "x", Suffix: "y"}, func(api.GenerateResponse) error { return nil })
	var se api.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusBadRequest {
		t.Errorf("a suffix without fill-in-the-middle: %v", err)
	}
}
