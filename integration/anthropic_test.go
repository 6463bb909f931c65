package integration

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/shared"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
)

// anthropicClient is the official Anthropic Go SDK, unchanged, pointed at
// the Edge.
func anthropicClient(base string) anthropic.Client {
	return anthropic.NewClient(option.WithBaseURL(base), option.WithAPIKey("unused-on-loopback"), option.WithMaxRetries(0))
}

// anthropicBackend is one provider behind the Edge, as the Anthropic
// tests see it.
type anthropicBackend struct {
	base  string
	model string // as the client names it
	text  string // what the model answers
	call  string // the tool it calls, with input {"city":...}
	// answerOnly makes the model answer without calling a tool (the
	// final turn of a round trip).
	answerOnly func()
	// lastChat is the body of the last chat request the provider received.
	lastChat func() string
}

// fakeOllamaBackend is the fake Ollama through the ollama adapter.
func fakeOllamaBackend(t *testing.T) anthropicBackend {
	models := fakeModels()
	s := startStack(t, models...)
	return anthropicBackend{
		base: s.base, model: "llama3.2", text: models[0].Text, call: "get_weather",
		answerOnly: func() { m := models[0]; m.ToolCalls = nil; s.fake.SetModel(m) },
		lastChat: func() string {
			var body string
			for _, r := range s.fake.Requests() {
				if r.Path == "/api/chat" {
					body = string(r.Body)
				}
			}
			return body
		},
	}
}

// fakeOpenAIBackend is the fake OpenAI-compatible server through the
// openai adapter.
func fakeOpenAIBackend(t *testing.T) anthropicBackend {
	model := fakeopenai.Model{Name: "qwen3-8b", Tokens: []string{"Checking", " the", " weather."},
		ToolCalls: []fakeopenai.ToolCall{{ID: "call_w1", Name: "get_weather", Arguments: `{"city":"Seoul","unit":"C"}`}}}
	fake := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{model}})
	t.Cleanup(fake.Close)
	base := openAIStack(t, fake, "")
	return anthropicBackend{
		base: base, model: "qwen3-8b", text: "Checking the weather.", call: "get_weather",
		answerOnly: func() {
			fake.Update(func(c *fakeopenai.Config) { c.Models[0].ToolCalls, c.Models[0].FinishReason = nil, "stop" })
		},
		lastChat: func() string {
			reqs := fake.Requests()
			for i := len(reqs) - 1; i >= 0; i-- {
				if reqs[i].Path == "/v1/chat/completions" {
					return string(reqs[i].Body)
				}
			}
			return ""
		},
	}
}

var anthropicWeatherTool = anthropic.ToolUnionParam{OfTool: &anthropic.ToolParam{
	Name:        "get_weather",
	Description: anthropic.String("the weather in a city now"),
	InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"city": map[string]any{"type": "string"}}},
}}

// P2, issue 12: the official Anthropic SDK, unchanged, against real edged
// and noded processes, over two different adapters: each model is listed
// in Anthropic's shape, a Message streams (text, a tool_use gathered from
// its input_json_delta pieces, stop reason, usage) and comes whole, and a
// tool_use round trip (assistant tool_use → user tool_result → final
// answer) reaches the model server as its own tool messages (R2).
func TestAnthropicSDKThroughTheEdge(t *testing.T) {
	for name, backend := range map[string]func(*testing.T) anthropicBackend{
		"ollama adapter": fakeOllamaBackend, "openai adapter": fakeOpenAIBackend,
	} {
		t.Run(name, func(t *testing.T) {
			b := backend(t)
			c := anthropicClient(b.base)

			page, err := c.Models.List(t.Context(), anthropic.ModelListParams{})
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, m := range page.Data {
				ids = append(ids, m.ID)
			}
			if !strings.Contains(strings.Join(ids, ","), b.model) || page.Data[0].Type != "model" {
				t.Errorf("models %v lack %s", ids, b.model)
			}

			params := anthropic.MessageNewParams{
				Model: anthropic.Model(b.model), MaxTokens: 256, Tools: []anthropic.ToolUnionParam{anthropicWeatherTool},
				System:   []anthropic.TextBlockParam{{Text: "You answer briefly."}},
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("What is the weather?"))},
			}
			stream := c.Messages.NewStreaming(t.Context(), params)
			var streamed anthropic.Message
			events := 0
			for stream.Next() {
				if err := streamed.Accumulate(stream.Current()); err != nil {
					t.Fatalf("accumulate: %v", err)
				}
				events++
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			checkToolUseAnswer(t, "streamed", streamed, b)
			if events < 8 {
				t.Errorf("%d events: the answer did not stream", events)
			}

			first, err := c.Messages.New(t.Context(), params)
			if err != nil {
				t.Fatal(err)
			}
			checkToolUseAnswer(t, "whole", *first, b)

			use := first.Content[len(first.Content)-1].AsToolUse()
			b.answerOnly()
			params.Messages = append(params.Messages, first.ToParam(),
				anthropic.NewUserMessage(anthropic.NewToolResultBlock(use.ID, "sunny, 21C", false)))
			final, err := c.Messages.New(t.Context(), params)
			if err != nil {
				t.Fatal(err)
			}
			if final.StopReason != anthropic.StopReasonEndTurn || len(final.Content) != 1 || final.Content[0].Text != b.text {
				t.Errorf("final answer %s", final.RawJSON())
			}
			chat := b.lastChat()
			if !strings.Contains(chat, `"role":"tool"`) || !strings.Contains(chat, "sunny, 21C") || !strings.Contains(chat, use.ID) {
				t.Errorf("the tool result did not reach the model server as a tool message: %s", chat)
			}

			// P1: a model no Node offers is the SDK's 404 not_found_error,
			// streamed or not.
			params.Model = "no-such-model"
			_, err = c.Messages.New(t.Context(), params)
			unknown := c.Messages.NewStreaming(t.Context(), params)
			for unknown.Next() {
				t.Error("an event of an unknown model was delivered")
			}
			for _, err := range []error{err, unknown.Err()} {
				var apiErr *anthropic.Error
				if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Type() != shared.ErrorTypeNotFoundError {
					t.Errorf("unknown model: %v, want a 404 not_found_error", err)
				}
			}
		})
	}
}

// checkToolUseAnswer checks an answer of text and one tool_use block.
func checkToolUseAnswer(t *testing.T, how string, m anthropic.Message, b anthropicBackend) {
	t.Helper()
	if len(m.Content) != 2 || m.Content[0].Type != "text" || m.Content[0].Text != b.text {
		t.Fatalf("%s: content %s", how, m.RawJSON())
	}
	use := m.Content[1].AsToolUse()
	var in struct{ City string }
	if m.Content[1].Type != "tool_use" || use.Name != b.call || use.ID == "" || json.Unmarshal(use.Input, &in) != nil || in.City == "" {
		t.Errorf("%s: tool use %s", how, m.Content[1].RawJSON())
	}
	if m.StopReason != anthropic.StopReasonToolUse || m.Usage.OutputTokens == 0 || !strings.HasPrefix(m.ID, "msg_") || m.Model != anthropic.Model(b.model) {
		t.Errorf("%s: message %s", how, m.RawJSON())
	}
}

// Issue 12: a failure after output has started reaches the SDK as its own
// error type, from the stream's error event, after the text that came
// before it; over both adapters (the fakes fail mid-stream).
func TestAnthropicSDKSeesAMidStreamFailure(t *testing.T) {
	ollama := startStack(t, fakeollama.Model{Name: "flaky:latest", TokenCount: 10, ErrorMessage: "out of memory", ErrorAfter: 3})
	fake := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "qwen3-8b", TokenCount: 10,
		Fail: &fakeopenai.Failure{MidStream: true, AfterChunks: 3, Message: "engine crashed"}}}})
	t.Cleanup(fake.Close)
	openai := openAIStack(t, fake, "")
	for _, tt := range []struct{ name, base, model, says string }{
		{"ollama adapter", ollama.base, "flaky", "out of memory"},
		{"openai adapter", openai, "qwen3-8b", "engine crashed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := anthropicClient(tt.base)
			stream := c.Messages.NewStreaming(t.Context(), anthropic.MessageNewParams{
				Model: anthropic.Model(tt.model), MaxTokens: 64,
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))},
			})
			var m anthropic.Message
			for stream.Next() {
				_ = m.Accumulate(stream.Current())
			}
			var apiErr *anthropic.Error
			if !errors.As(stream.Err(), &apiErr) || apiErr.Type() != shared.ErrorTypeAPIError || !strings.Contains(apiErr.Message, tt.says) {
				t.Fatalf("err = %v, want an api_error saying %q", stream.Err(), tt.says)
			}
			if len(m.Content) != 1 || m.Content[0].Text == "" {
				t.Errorf("no text before the error: %s", m.RawJSON())
			}
		})
	}
}

// Issue 12 (refusals, as in issue 4): with the only slot busy and no
// queue, a Messages request is refused at once as the SDK's 429
// rate_limit_error, with the reason in X-IOP-Refusal and a Retry-After.
func TestAnthropicSDKSeesARefusal(t *testing.T) {
	fake := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "qwen3-8b", TokenCount: 20, Delay: 100 * time.Millisecond}}})
	t.Cleanup(fake.Close)
	base := openAIStack(t, fake, `
api: {allow_anonymous: true}
profiles: [{name: default, max_queue_depth: 0}]
`)
	c := anthropicClient(base)
	params := anthropic.MessageNewParams{Model: "qwen3-8b", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))}}
	held := make(chan error, 1)
	go func() {
		_, err := c.Messages.New(t.Context(), params)
		held <- err
	}()
	waitFor(t, "the only slot taken", func() bool {
		for _, r := range fake.Requests() {
			if r.Path == "/v1/chat/completions" {
				return true
			}
		}
		return false
	})
	for _, stream := range []bool{false, true} {
		var err error
		if stream {
			s := c.Messages.NewStreaming(t.Context(), params)
			for s.Next() {
				t.Error("an event of a refused request was delivered")
			}
			err = s.Err()
		} else {
			_, err = c.Messages.New(t.Context(), params)
		}
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Type() != shared.ErrorTypeRateLimitError {
			t.Fatalf("stream=%v: %v, want a 429 rate_limit_error", stream, err)
		}
		if h := apiErr.Response.Header; h.Get("X-Iop-Refusal") != "queue_full" || h.Get("Retry-After") == "" {
			t.Errorf("stream=%v: headers %v", stream, h)
		}
	}
	if err := <-held; err != nil {
		t.Errorf("the request holding the slot: %v", err)
	}
}
