package integration

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
)

// ollamaClient is the official Ollama Go client pointed at base.
func ollamaClient(t *testing.T, base string) *api.Client {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	return api.NewClient(u, http.DefaultClient)
}

// P1, P2, issue 11: the official Ollama client against `go run ./edged/dev`, whose
// only model is the simulator's, as a user of the ollama CLI would use it:
// the model is listed, shown, and a chat and a generate stream to done:true.
// Before, /api/tags was empty and the chat 503 no_candidate.
func TestOllamaClientAgainstEdgedDevRunsTheSimulator(t *testing.T) {
	dev := start(t, "dev", bin.dev, "--http-addr", "127.0.0.1:0")
	base := dev.waitOutput(regexp.MustCompile(`Edge HTTP API\s+(http://\S+)`))
	waitNode(t, base, "dev-node", "ready", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
	})
	c := ollamaClient(t, base)
	list, err := c.List(t.Context())
	if err != nil || len(list.Models) != 1 || list.Models[0].Name != "sim-small" {
		t.Fatalf("list %+v, %v; want sim-small", list, err)
	}
	if show, err := c.Show(t.Context(), &api.ShowRequest{Model: "sim-small"}); err != nil || len(show.Capabilities) == 0 {
		t.Errorf("show %+v, %v", show, err)
	}
	var chat strings.Builder
	var last api.ChatResponse
	err = c.Chat(t.Context(), &api.ChatRequest{Model: "sim-small", Messages: []api.Message{{Role: "user", Content: "hello"}}},
		func(r api.ChatResponse) error { chat.WriteString(r.Message.Content); last = r; return nil })
	if err != nil || chat.Len() == 0 || !last.Done || last.DoneReason == "" || last.EvalCount == 0 {
		t.Errorf("chat %q, last %+v, %v", chat.String(), last, err)
	}
	var gen strings.Builder
	var lastGen api.GenerateResponse
	err = c.Generate(t.Context(), &api.GenerateRequest{Model: "sim-small", Prompt: "hello"},
		func(r api.GenerateResponse) error { gen.WriteString(r.Response); lastGen = r; return nil })
	if err != nil || gen.Len() == 0 || !lastGen.Done {
		t.Errorf("generate %q, last %+v, %v", gen.String(), lastGen, err)
	}
	if ps, err := c.ListRunning(t.Context()); err != nil || len(ps.Models) != 1 || ps.Models[0].Name != "sim-small" {
		t.Errorf("ps %+v, %v", ps, err)
	}
}

// openAIStack runs edged and one noded whose provider is the fake
// OpenAI-compatible server, through the openai adapter.
func openAIStack(t *testing.T, fake *fakeopenai.Server, profile string) string {
	t.Helper()
	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	edgeConf, nodeConf := filepath.Join(dir, "edge.yaml"), filepath.Join(dir, "node.yaml")
	writeFile(t, edgeConf, fmt.Sprintf("listen: {quic: \"127.0.0.1:%d\", http: \"127.0.0.1:%d\"}\nidentity: {mode: loopback}\n%s", quicPort, httpPort, profile))
	writeFile(t, nodeConf, fmt.Sprintf(`
node_id: n1
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
providers:
  - {name: vllm, adapter: openai, capacity: 1, targets: [qwen3-8b], config: {base_url: %q}}
`, quicPort, fake.BaseURL()))
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	start(t, "edged", bin.edged, "run", "--config", edgeConf)
	start(t, "noded", bin.noded, "run", "--config", nodeConf)
	waitNode(t, base, "n1", "ready", func(n nodeView) bool { return n.State == "ready" && n.Providers[0].State == "online" })
	return base
}

// P2, issue 11: the official Ollama client streams a chat with a tool call
// from an OpenAI-compatible server (the fake), through a normalized run:
// the fragments the server streams arrive as one Ollama tool call.
func TestOllamaClientChatsWithAToolCallOnAnOpenAICompatibleServer(t *testing.T) {
	fake := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "qwen3-8b", Tokens: []string{"Checking", "."},
		ToolCalls: []fakeopenai.ToolCall{{Name: "get_weather", Arguments: `{"city":"Seoul","unit":"C"}`}}}}})
	defer fake.Close()
	base := openAIStack(t, fake, "")
	c := ollamaClient(t, base)
	tool := api.Tool{Type: "function", Function: api.ToolFunction{Name: "get_weather", Description: "weather now",
		Parameters: api.ToolFunctionParameters{Type: "object"}}}
	var calls []api.ToolCall
	var content strings.Builder
	var last api.ChatResponse
	err := c.Chat(t.Context(), &api.ChatRequest{Model: "qwen3-8b", Tools: api.Tools{tool},
		Messages: []api.Message{{Role: "user", Content: "weather in Seoul?"}}},
		func(r api.ChatResponse) error {
			content.WriteString(r.Message.Content)
			calls = append(calls, r.Message.ToolCalls...)
			last = r
			return nil
		})
	if err != nil || content.String() != "Checking." || !last.Done {
		t.Fatalf("chat %q, last %+v, %v", content.String(), last, err)
	}
	if len(calls) != 1 || calls[0].Function.Name != "get_weather" {
		t.Fatalf("tool calls %+v", calls)
	}
	if city, _ := calls[0].Function.Arguments.Get("city"); city != "Seoul" {
		t.Errorf("arguments %+v", calls[0].Function.Arguments)
	}
	if list, err := c.List(t.Context()); err != nil || len(list.Models) != 1 || list.Models[0].Name != "qwen3-8b" {
		t.Errorf("list %+v, %v", list, err)
	}
}

// Issue 11: a streamed OpenAI request gets its headers and ": keep-alive"
// comments while it waits in the queue and then in a silent prefill (real
// processes, keepalive_interval 1s), and then its answer: a proxy with a
// first-byte limit would not cut it.
func TestAStreamedRequestGetsKeepAlivesWhileQueuedAndInPrefill(t *testing.T) {
	fake := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: "qwen3-8b", Tokens: []string{"late", " answer"},
		HeaderDelay: 4 * time.Second}}})
	defer fake.Close()
	base := openAIStack(t, fake, `
api: {allow_anonymous: true}
profiles: [{name: default, keepalive_interval: 1s, queue_timeout: 30s}]
`)
	body := `{"model":"qwen3-8b","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	// The first request holds the only slot for its 4 s prefill; the
	// second waits in the queue, then has its own 4 s prefill.
	first := make(chan error, 1)
	go func() {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		first <- err
	}()
	time.Sleep(500 * time.Millisecond)
	began := time.Now()
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	headersAfter := time.Since(began)
	r := bufio.NewReader(resp.Body)
	keepAlives, sawAnswer, sawDone := 0, false, false
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break
		}
		switch line = strings.TrimSpace(line); {
		case line == ": keep-alive":
			if sawAnswer {
				t.Error("a keep-alive after the answer began")
			}
			keepAlives++
		case strings.Contains(line, `"late"`):
			sawAnswer = true
		case line == "data: [DONE]":
			sawDone = true
		case strings.Contains(line, `"error"`):
			t.Errorf("error event: %s", line)
		}
	}
	if headersAfter > 3*time.Second || keepAlives < 4 || !sawAnswer || !sawDone {
		t.Errorf("headers after %v, %d keep-alives, answer %v, [DONE] %v; want headers within the first seconds, "+
			"keep-alives through ~7 s of queue and prefill, then the answer", headersAfter, keepAlives, sawAnswer, sawDone)
	}
	t.Logf("headers after %v, %d keep-alives before the answer", headersAfter.Round(time.Millisecond), keepAlives)
	if err := <-first; err != nil {
		t.Errorf("first request: %v", err)
	}
}
