package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
)

// passThroughStack is a real edged and a real noded whose Node serves one
// model through the openai adapter (the fake OpenAI-compatible server) and
// one through the ollama adapter (the fake Ollama).
type passThroughStack struct {
	base         string
	fakeOpenAI   *fakeopenai.Server
	fakeOllama   *fakeollama.Server
	openAIModel  string
	ollamaModel  string
	openAIClient openai.Client
}

func startPassThroughStack(t *testing.T) *passThroughStack {
	t.Helper()
	s := &passThroughStack{openAIModel: "gpt-fake", ollamaModel: "llama3.2"}
	s.fakeOpenAI = fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: s.openAIModel, Tokens: []string{"Hi", "!"},
		ToolCalls: []fakeopenai.ToolCall{{Name: "get_weather", Arguments: `{"city":"Seoul"}`}}}}})
	t.Cleanup(s.fakeOpenAI.Close)
	s.fakeOllama = fakeollama.New(fakeollama.Model{Name: s.ollamaModel + ":latest", Text: "Hello there."})
	t.Cleanup(s.fakeOllama.Close)

	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	edgeConf, nodeConf := filepath.Join(dir, "edge.yaml"), filepath.Join(dir, "node.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api: {allow_anonymous: true}
`, quicPort, httpPort))
	writeFile(t, nodeConf, fmt.Sprintf(`
node_id: n1
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
providers:
  - {name: compat, adapter: openai, capacity: 4, targets: [%s], config: {base_url: %q}}
  - {name: ollama, adapter: ollama, capacity: 4, targets: ["%s:latest"], config: {base_url: %q}}
`, quicPort, s.openAIModel, s.fakeOpenAI.BaseURL(), s.ollamaModel, s.fakeOllama.URL()))
	s.base = fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	start(t, "edged", bin.edged, "run", "--config", edgeConf)
	start(t, "noded", bin.noded, "run", "--config", nodeConf)
	waitNode(t, s.base, "n1", "ready with both providers online", func(n nodeView) bool {
		if n.State != "ready" || len(n.Providers) != 2 {
			return false
		}
		for _, p := range n.Providers {
			if p.State != "online" {
				return false
			}
		}
		return true
	})
	s.openAIClient = openai.NewClient(option.WithBaseURL(s.base+"/v1/"), option.WithAPIKey("unused-on-loopback"), option.WithMaxRetries(0))
	return s
}

// chatParams is a question with one tool, for model.
func chatParams(model string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    model,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Seoul?")},
		Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: "get_weather", Parameters: shared.FunctionParameters{"type": "object"},
		})},
	}
}

// extras are the fields the OpenAI SDK has no parameter for, set the way
// its documentation says to: a sampling field vLLM and Ollama know, a
// vendor's template switch, and a field of no server at all.
var extras = []option.RequestOption{
	option.WithJSONSet("top_k", 20),
	option.WithJSONSet("chat_template_kwargs", map[string]any{"enable_thinking": false}),
	option.WithJSONSet("x_vendor_trace", "abc"),
}

// P2: fields the Edge does not interpret, sent with the official OpenAI SDK,
// reach the model server: as they were sent for an OpenAI-compatible
// server, with tool_choice in OpenAI's form; for Ollama, top_k in options
// and the rest at the top level of its request (issue 21: Ollama ignores
// what it does not know, servers that speak its API read it).
func TestUninterpretedFieldsReachTheModelServer(t *testing.T) {
	s := startPassThroughStack(t)
	c := s.openAIClient

	p := chatParams(s.openAIModel)
	p.ToolChoice = openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_weather"})
	stream := c.Chat.Completions.NewStreaming(t.Context(), p, extras...)
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("OpenAI-compatible model: %v", err)
	}
	if calls := acc.Choices[0].Message.ToolCalls; len(calls) != 1 || calls[0].Function.Name != "get_weather" {
		t.Errorf("tool calls %+v", calls)
	}
	body := recordedFields(t, s.openAIChats()[0])
	for k, want := range map[string]string{
		"top_k": `20`, "chat_template_kwargs": `{"enable_thinking":false}`, "x_vendor_trace": `"abc"`,
		"tool_choice": `{"function":{"name":"get_weather"},"type":"function"}`,
	} {
		if got := body[k]; got != want {
			t.Errorf("OpenAI-compatible server received %s = %s, want %s", k, got, want)
		}
	}

	p = chatParams(s.ollamaModel)
	p.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")}
	done, err := c.Chat.Completions.New(t.Context(), p, extras...)
	if err != nil {
		t.Fatalf("Ollama model: %v", err)
	}
	if got := done.Choices[0].Message.Content; got != "Hello there." {
		t.Errorf("Ollama model answered %q", got)
	}
	body = recordedFields(t, s.ollamaChats()[0])
	if got := recordedFields(t, []byte(body["options"]))["top_k"]; got != `20` {
		t.Errorf("Ollama received options %s, want top_k 20 in them", body["options"])
	}
	for k, want := range map[string]string{"chat_template_kwargs": `{"enable_thinking":false}`, "x_vendor_trace": `"abc"`} {
		if got := body[k]; got != want {
			t.Errorf("Ollama received %s = %s, want %s at the top level", k, got, want)
		}
	}
	for _, k := range []string{"top_k", "tools", "tool_choice"} {
		if v, ok := body[k]; ok {
			t.Errorf("Ollama received %s = %s at the top level (top_k goes in options; tool_choice none withholds the tools)", k, v)
		}
	}
}

// P2: a tool choice naming a function that is not among the tools is a
// clear 400 that the SDK reports, refused by the Edge before any provider
// is asked. (A forced choice on Ollama, which cannot force a call, is
// constrained to the tool's schema: sdk_agents_forced_test.go.)
func TestAToolChoiceOfNoToolIsA400(t *testing.T) {
	s := startPassThroughStack(t)
	c := s.openAIClient
	for _, tt := range []struct {
		name   string
		model  string
		choice openai.ChatCompletionToolChoiceOptionUnionParam
		param  string // the param the 400 names: the Edge's own refusals name it
		says   string
	}{
		{"a function not among the tools", s.openAIModel,
			openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "send_mail"}),
			"tool_choice", "not among tools"},
		{"a function not among the tools, on Ollama", s.ollamaModel,
			openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "send_mail"}),
			"tool_choice", "not among tools"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := chatParams(tt.model)
			p.ToolChoice = tt.choice
			_, err := c.Chat.Completions.New(t.Context(), p)
			if !badRequest(err, tt.param, tt.says) {
				t.Errorf("err = %v; want a 400 saying %q", err, tt.says)
			}
			stream := c.Chat.Completions.NewStreaming(t.Context(), p)
			for stream.Next() {
			}
			if err := stream.Err(); !badRequest(err, tt.param, tt.says) {
				t.Errorf("streamed: err = %v; want a 400 saying %q", err, tt.says)
			}
		})
	}
	if n := len(s.ollamaChats()); n != 0 {
		t.Errorf("Ollama received %d chat requests for tool choices it cannot honour", n)
	}
	if n := len(s.openAIChats()); n != 0 {
		t.Errorf("the OpenAI-compatible server received %d chat requests for a tool choice the Edge refused", n)
	}
}

// badRequest reports whether err is the SDK's error for a 400 naming
// param whose message says says.
func badRequest(err error, param, says string) bool {
	var apiErr *openai.Error
	return errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusBadRequest &&
		apiErr.Type == "invalid_request_error" && apiErr.Param == param && strings.Contains(apiErr.Message, says)
}

// openAIChats returns the bodies of the chat requests the fake
// OpenAI-compatible server received (not the adapter's model listings).
func (s *passThroughStack) openAIChats() [][]byte {
	var out [][]byte
	for _, r := range s.fakeOpenAI.Requests() {
		if strings.HasSuffix(r.Path, "/chat/completions") {
			out = append(out, r.Body)
		}
	}
	return out
}

// ollamaChats returns the bodies of the /api/chat requests the fake Ollama
// received (not the adapter's listings and probes).
func (s *passThroughStack) ollamaChats() [][]byte {
	var out [][]byte
	for _, r := range s.fakeOllama.Requests() {
		if r.Path == "/api/chat" {
			out = append(out, r.Body)
		}
	}
	return out
}

// recordedFields decodes a recorded JSON object body into its fields, each
// as compact JSON.
func recordedFields(t *testing.T, body []byte) map[string]string {
	t.Helper()
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		t.Fatalf("recorded body %s: %v", body, err)
	}
	out := map[string]string{}
	for k, v := range fields {
		b, _ := json.Marshal(v)
		out[k] = string(b)
	}
	return out
}
