package integration

import (
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
)

// stack is a real edged and a real noded (with plugin processes) on
// loopback, in front of the fake Ollama: what a person runs on one machine.
type stack struct {
	base   string // the Edge's HTTP base URL
	health string // the Node's health and metrics base URL (startStackWithNodeHealth)
	fake   *fakeollama.Server
	edge   *proc
	node   *proc
}

func startStack(t *testing.T, models ...fakeollama.Model) *stack {
	t.Helper()
	return startStackOf(t, 4, models...)
}

// startStackOf is startStack with capacity runs at once on the provider.
func startStackOf(t *testing.T, capacity int, models ...fakeollama.Model) *stack {
	t.Helper()
	return startStackWith(t, capacity, false, models...)
}

// startStackWithNodeHealth is startStackOf with the Node's /metrics served
// (stack.health).
func startStackWithNodeHealth(t *testing.T, capacity int, models ...fakeollama.Model) *stack {
	t.Helper()
	return startStackWith(t, capacity, true, models...)
}

func startStackWith(t *testing.T, capacity int, nodeHealth bool, models ...fakeollama.Model) *stack {
	t.Helper()
	fake := fakeollama.New(models...)
	t.Cleanup(fake.Close)
	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	edgeConf, nodeConf := filepath.Join(dir, "edge.yaml"), filepath.Join(dir, "node.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
edge_id: edge-1
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api: {allow_anonymous: true}
profiles:
  - {name: default, deadline: 2m, queue_timeout: 5s, max_queue_depth: 16, idle_timeout: 30s}
`, quicPort, httpPort))
	writeFile(t, nodeConf, fmt.Sprintf(`
node_id: n1
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
providers:
  - {name: ollama, adapter: ollama, capacity: %d, config: {base_url: %q}}
`, quicPort, capacity, fake.URL()))
	s := &stack{base: fmt.Sprintf("http://127.0.0.1:%d", httpPort), fake: fake}
	s.edge = start(t, "edged", bin.edged, "run", "--config", edgeConf)
	nodeArgs := []string{"run", "--config", nodeConf}
	if nodeHealth {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp"))
		s.health = "http://" + addr
		nodeArgs = append(nodeArgs, "--health-addr", addr)
	}
	s.node = start(t, "noded", bin.noded, nodeArgs...)
	waitNode(t, s.base, "n1", "ready with ollama online", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
	})
	return s
}

func (s *stack) openai() openai.Client {
	return openai.NewClient(option.WithBaseURL(s.base+"/v1/"), option.WithAPIKey("unused-on-loopback"), option.WithMaxRetries(0))
}

// The official OpenAI Go SDK, unchanged, against the Edge: a streamed chat
// with a tool call and usage, model listing, and a clear error for a model
// no Node has.
func TestOfficialOpenAIClientThroughTheEdge(t *testing.T) {
	s := startStack(t, fakeModels()...)
	c := s.openai()

	models, err := c.Models.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range models.Data {
		ids = append(ids, m.ID)
	}
	if !strings.Contains(strings.Join(ids, ","), "llama3.2:latest") {
		t.Errorf("models %v lack llama3.2:latest", ids)
	}

	stream := c.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model:    "llama3.2",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Why is the sky blue?")},
		Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: "get_weather", Parameters: shared.FunctionParameters{"type": "object"},
		})},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	acc := openai.ChatCompletionAccumulator{}
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if chunks < 5 {
		t.Errorf("%d chunks: the answer did not stream", chunks)
	}
	msg := acc.Choices[0].Message
	if msg.Content != "The sky is blue because of Rayleigh scattering." {
		t.Errorf("content %q", msg.Content)
	}
	if len(msg.ToolCalls) != 1 || msg.ToolCalls[0].Function.Name != "get_weather" || msg.ToolCalls[0].Function.Arguments != `{"city":"Paris"}` {
		t.Errorf("tool calls %+v", msg.ToolCalls)
	}
	if acc.Choices[0].FinishReason != "tool_calls" || acc.Usage.CompletionTokens == 0 {
		t.Errorf("finish %q usage %+v", acc.Choices[0].FinishReason, acc.Usage)
	}

	_, err = c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: "no-such-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	// P1, issue 11: a model no Node offers and no route names is the SDK's
	// not-found error (404 model_not_found), streamed or not.
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Errorf("unknown model: %v, want a 404 model_not_found error", err)
	}
	unknown := c.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model: "no-such-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	for unknown.Next() {
		t.Error("a chunk of an unknown model was delivered")
	}
	if !errors.As(unknown.Err(), &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Errorf("unknown model, streamed: %v, want a 404 model_not_found error", unknown.Err())
	}
}
