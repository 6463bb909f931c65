package integration

import (
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
)

// The Responses API (POST /v1/responses, issue 12) with the official
// OpenAI Go SDK, unchanged, against real edged and noded processes and
// their plugin processes, over two adapters: the ollama adapter in front of
// the fake Ollama, and the openai adapter in front of the fake
// OpenAI-compatible server. Both answer Responses clients through the one
// normalized run (SPEC R2, P2).

// responsesClient is the official SDK pointed at an Edge.
func responsesClient(base string) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused-on-loopback"), option.WithMaxRetries(0))
}

// respBackend is an Edge whose model answers a weather question with a
// function call until answerOnly, as a model given the tool's result does.
type respBackend struct {
	base       string
	model      string
	answer     string           // the answer once answerOnly is called
	answerOnly func()           // the model stops calling the tool
	lastChat   func() []byte    // the body of the last chat request the model server got
	fail       func(msg string) // the model fails after its first pieces of output
	slow       func()           // the model answers slowly (about 2 s); nil: not tried
}

var getWeather = responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{
	Name: "get_weather", Description: openai.String("the weather now"), Strict: openai.Bool(false),
	Parameters: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
}}

// ollamaBackend: the ollama adapter, capacity 4, in front of the fake
// Ollama; its model thinks, answers and calls get_weather.
func ollamaBackend(t *testing.T) *respBackend {
	model := fakeollama.Model{Name: "llama3.2:latest", Text: "Let me check.", Thinking: "The user wants the weather.",
		ToolCalls: []fakeollama.ToolCall{{Name: "get_weather", Arguments: []byte(`{"city":"Seoul"}`)}}}
	s := startStack(t, model)
	b := &respBackend{base: s.base, model: "llama3.2", answer: "It is 22C and sunny in Seoul."}
	b.answerOnly = func() {
		m := model
		m.ToolCalls, m.Thinking, m.Text = nil, "", b.answer
		s.fake.SetModel(m)
	}
	b.lastChat = func() []byte {
		var last []byte
		for _, r := range s.fake.Requests() {
			if r.Path == "/api/chat" {
				last = r.Body
			}
		}
		return last
	}
	b.fail = func(msg string) {
		m := model
		m.ToolCalls, m.Thinking, m.TokenCount, m.Text, m.ErrorMessage, m.ErrorAfter = nil, "", 10, "", msg, 3
		s.fake.SetModel(m)
	}
	return b
}

// openAIBackend: the openai adapter, capacity 1 and no queue (a second
// request while one runs is refused queue_full), in front of the fake
// OpenAI-compatible server; its model reasons, answers and calls
// get_weather in fragments.
func openAIBackend(t *testing.T) *respBackend {
	model := fakeopenai.Model{Name: "qwen3-8b", Tokens: []string{"Let", " me", " check."}, Reasoning: []string{"The user", " wants the weather."},
		ToolCalls: []fakeopenai.ToolCall{{ID: "call_w1", Name: "get_weather", Arguments: `{"city":"Seoul"}`}}}
	fake := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{model}})
	t.Cleanup(fake.Close)
	base := openAIStack(t, fake, `
api: {allow_anonymous: true}
profiles: [{name: default, max_queue_depth: 0, queue_timeout: 5s}]
`)
	b := &respBackend{base: base, model: "qwen3-8b", answer: "It is 22C and sunny in Seoul."}
	set := func(f func(*fakeopenai.Model)) {
		fake.Update(func(c *fakeopenai.Config) {
			m := model
			f(&m)
			c.Models = []fakeopenai.Model{m}
		})
	}
	b.answerOnly = func() {
		set(func(m *fakeopenai.Model) {
			m.ToolCalls, m.Reasoning, m.Tokens = nil, nil, []string{"It is 22C", " and sunny", " in Seoul."}
		})
	}
	b.lastChat = func() []byte {
		var last []byte
		for _, r := range fake.Requests() {
			if strings.HasSuffix(r.Path, "/chat/completions") {
				last = r.Body
			}
		}
		return last
	}
	b.fail = func(msg string) {
		set(func(m *fakeopenai.Model) {
			m.ToolCalls, m.Reasoning = nil, nil
			m.Fail = &fakeopenai.Failure{Status: http.StatusInternalServerError, Message: msg, MidStream: true, AfterChunks: 2}
		})
	}
	b.slow = func() { set(func(m *fakeopenai.Model) { m.ToolCalls, m.Delay = nil, 700*time.Millisecond }) }
	return b
}

// P2, R2, issue 12: a function call round trip with the official SDK on
// each adapter: the first turn (not streamed) answers with reasoning, text
// and a function_call; the second (streamed) sends the whole output back
// with the call's output, and the model server gets them as a chat
// history (the assistant's tool call, then the tool's answer) and answers.
func TestOfficialClientResponsesFunctionCallRoundTrip(t *testing.T) {
	for name, backend := range map[string]func(*testing.T) *respBackend{"ollama adapter": ollamaBackend, "openai adapter": openAIBackend} {
		t.Run(name, func(t *testing.T) {
			b := backend(t)
			c := responsesClient(b.base)
			question := responses.ResponseInputItemParamOfMessage("What is the weather in Seoul?", responses.EasyInputMessageRoleUser)
			first, err := c.Responses.New(t.Context(), responses.ResponseNewParams{
				Model: b.model, Instructions: openai.String("Answer briefly."),
				Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{question}},
				Tools: []responses.ToolUnionParam{getWeather},
			})
			if err != nil {
				t.Fatal(err)
			}
			var call responses.ResponseFunctionToolCall
			kinds := []string{}
			for _, item := range first.Output {
				kinds = append(kinds, item.Type)
				if item.Type == "function_call" {
					call = item.AsFunctionCall()
				}
			}
			if first.Status != responses.ResponseStatusCompleted || first.OutputText() != "Let me check." ||
				strings.Join(kinds, ",") != "reasoning,message,function_call" || first.Usage.OutputTokens == 0 {
				t.Fatalf("first response: %s", first.RawJSON())
			}
			if call.Name != "get_weather" || call.CallID == "" || !json.Valid([]byte(call.Arguments)) ||
				!strings.Contains(call.Arguments, "Seoul") {
				t.Fatalf("function call %+v", call)
			}

			b.answerOnly()
			input := responses.ResponseInputParam{question}
			for _, item := range first.Output {
				switch v := item.AsAny().(type) {
				case responses.ResponseReasoningItem:
					p := v.ToParam()
					input = append(input, responses.ResponseInputItemUnionParam{OfReasoning: &p})
				case responses.ResponseOutputMessage:
					p := v.ToParam()
					input = append(input, responses.ResponseInputItemUnionParam{OfOutputMessage: &p})
				case responses.ResponseFunctionToolCall:
					p := v.ToParam()
					input = append(input, responses.ResponseInputItemUnionParam{OfFunctionCall: &p})
				}
			}
			result := responses.ResponseInputItemParamOfFunctionCallOutput(`{"temperature_c":22,"sky":"sunny"}`)
			result.OfFunctionCallOutput.CallID = openai.String(call.CallID)
			input = append(input, result)
			stream := c.Responses.NewStreaming(t.Context(), responses.ResponseNewParams{
				Model: b.model, Instructions: openai.String("Answer briefly."),
				Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input},
				Tools: []responses.ToolUnionParam{getWeather},
			})
			var events []string
			var text strings.Builder
			var final responses.Response
			seq := int64(0)
			var acc responses.ResponseAccumulator // the SDK's own check of ids, indices and the terminal
			for stream.Next() {
				ev := stream.Current()
				var server responses.ResponsesServerEventUnion
				if err := json.Unmarshal([]byte(ev.RawJSON()), &server); err != nil || acc.AddEvent(server) != nil {
					t.Errorf("the accumulator refused %s (%v)", ev.RawJSON(), err)
				}
				events = append(events, ev.Type)
				if ev.SequenceNumber != seq {
					t.Errorf("event %s has sequence_number %d, want %d", ev.Type, ev.SequenceNumber, seq)
				}
				seq++
				switch v := ev.AsAny().(type) {
				case responses.ResponseTextDeltaEvent:
					text.WriteString(v.Delta)
				case responses.ResponseCompletedEvent:
					final = v.Response
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if len(events) < 8 || events[0] != "response.created" || events[1] != "response.in_progress" ||
				events[len(events)-1] != "response.completed" {
				t.Errorf("events %q", events)
			}
			if text.String() != b.answer || final.OutputText() != b.answer || final.Status != responses.ResponseStatusCompleted ||
				final.Usage.OutputTokens == 0 || final.ID == first.ID {
				t.Errorf("text %q; final response %s", text.String(), final.RawJSON())
			}
			if whole, err := acc.ReconstructedResponse(); err != nil || whole.OutputText() != b.answer {
				t.Errorf("accumulated response %v: %+v", err, whole)
			}

			// The model server got the turn as a chat history.
			var chat struct {
				Messages []struct {
					Role       string            `json:"role"`
					Content    string            `json:"content"`
					ToolCalls  []json.RawMessage `json:"tool_calls"`
					ToolCallID string            `json:"tool_call_id"`
				} `json:"messages"`
			}
			if err := json.Unmarshal(b.lastChat(), &chat); err != nil {
				t.Fatal(err)
			}
			var roles []string
			for _, m := range chat.Messages {
				roles = append(roles, m.Role)
			}
			if got := strings.Join(roles, ","); got != "system,user,assistant,tool" {
				t.Fatalf("the model server got roles %s: %s", got, b.lastChat())
			}
			if a, tool := chat.Messages[2], chat.Messages[3]; a.Content != "Let me check." || len(a.ToolCalls) != 1 ||
				!strings.Contains(string(a.ToolCalls[0]), "get_weather") || !strings.Contains(tool.Content, `"temperature_c":22`) {
				t.Errorf("the model server got %s", b.lastChat())
			}
		})
	}
}

// P1, P2, issue 12: what goes wrong reaches the SDK as its own error, on
// each adapter: an unknown model is a 404 model_not_found *openai.Error,
// streamed or not; a failure after output started ends the stream with
// the stream's error (and a response sent whole with a 502 *openai.Error);
// a refusal (queue_full: capacity 1, max_queue_depth 0) is a 429
// *openai.Error with its code.
func TestOfficialClientSeesResponsesErrorsFromRealDaemons(t *testing.T) {
	for name, backend := range map[string]func(*testing.T) *respBackend{"ollama adapter": ollamaBackend, "openai adapter": openAIBackend} {
		t.Run(name, func(t *testing.T) {
			b := backend(t)
			c := responsesClient(b.base)
			params := func(model string) responses.ResponseNewParams {
				return responses.ResponseNewParams{Model: model, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}
			}
			var apiErr *openai.Error
			_, err := c.Responses.New(t.Context(), params("no-such-model"))
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
				t.Errorf("unknown model: %v", err)
			}
			unknown := c.Responses.NewStreaming(t.Context(), params("no-such-model"))
			for unknown.Next() {
				t.Error("an event of an unknown model")
			}
			if !errors.As(unknown.Err(), &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
				t.Errorf("unknown model, streamed: %v", unknown.Err())
			}

			b.fail("engine died")
			stream := c.Responses.NewStreaming(t.Context(), params(b.model))
			var text strings.Builder
			var last string
			for stream.Next() {
				last = stream.Current().Type
				if v, ok := stream.Current().AsAny().(responses.ResponseTextDeltaEvent); ok {
					text.WriteString(v.Delta)
				}
			}
			var se *ssestream.StreamError
			if text.Len() == 0 || last == "response.completed" || !errors.As(stream.Err(), &se) ||
				!strings.Contains(se.Error(), "engine died") {
				t.Errorf("mid-stream failure: text %q, last event %s, stream error %v", text.String(), last, stream.Err())
			}
			_, err = c.Responses.New(t.Context(), params(b.model))
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadGateway || !strings.Contains(apiErr.Message, "engine died") {
				t.Errorf("failure, whole response: %v", err)
			}

			if b.slow == nil {
				return
			}
			b.slow()
			done := make(chan error, 1)
			go func() {
				_, err := c.Responses.New(t.Context(), params(b.model))
				done <- err
			}()
			waitFor(t, "the first request running", func() bool { return queuedOrRunning(t, b.base) == 1 })
			_, err = c.Responses.New(t.Context(), params(b.model))
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "queue_full" ||
				apiErr.Response.Header.Get("X-Iop-Refusal") != "queue_full" {
				t.Errorf("refusal: %v", err)
			}
			busy := c.Responses.NewStreaming(t.Context(), params(b.model))
			for busy.Next() {
				t.Error("an event of a refused request")
			}
			if !errors.As(busy.Err(), &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "queue_full" {
				t.Errorf("refusal, streamed: %v", busy.Err())
			}
			if err := <-done; err != nil {
				t.Errorf("the request holding the slot: %v", err)
			}
		})
	}
}

// P2, issue 12: `go run ./edged/dev` answers a Responses client from its simulator,
// streamed and not: the third adapter behind the same front end.
func TestOfficialClientResponsesOnEdgedDev(t *testing.T) {
	dev := start(t, "dev", bin.dev, "--http-addr", "127.0.0.1:0")
	base := dev.waitOutput(regexp.MustCompile(`Edge HTTP API\s+(http://\S+)`))
	waitNode(t, base, "dev-node", "ready", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
	})
	c := responsesClient(base)
	params := responses.ResponseNewParams{Model: "sim-small", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")}}
	whole, err := c.Responses.New(t.Context(), params)
	if err != nil || whole.Status != responses.ResponseStatusCompleted || whole.OutputText() == "" {
		t.Fatalf("response %v: %+v", err, whole)
	}
	stream := c.Responses.NewStreaming(t.Context(), params)
	var final responses.Response
	for stream.Next() {
		if v, ok := stream.Current().AsAny().(responses.ResponseCompletedEvent); ok {
			final = v.Response
		}
	}
	if err := stream.Err(); err != nil || final.OutputText() == "" || final.Usage.TotalTokens == 0 {
		t.Errorf("stream %v, final %s", err, final.RawJSON())
	}
}
