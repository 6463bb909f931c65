package integration

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// The Ollama relay's two silent wrongs (issue 10 item 8), on the real
// daemons: an alias route's name reaching the provider, and a stream that
// ends without its done line reaching the client as a success.

// relayStack is an Edge with alias routes and two Nodes, each in front of
// its own fake Ollama: n1 serves llama3.2:latest and cut:latest (a model
// whose stream ends without its done line), n2 serves qwen3:8b.
type relayStack struct {
	base   string
	n1, n2 *fakeollama.Server
	client *api.Client
}

const relayAnswer = "The sky is blue because of Rayleigh scattering."

func startRelayStack(t *testing.T) *relayStack {
	t.Helper()
	s := &relayStack{
		n1: fakeollama.New(fakeollama.Model{Name: "llama3.2:latest", Text: relayAnswer},
			fakeollama.Model{Name: "cut:latest", TokenCount: 3, EndWithoutDone: true}),
		n2: fakeollama.New(fakeollama.Model{Name: "qwen3:8b", Text: relayAnswer}),
	}
	t.Cleanup(s.n1.Close)
	t.Cleanup(s.n2.Close)
	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	s.base = fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	edgeConf := filepath.Join(dir, "edge.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api: {allow_anonymous: true}
profiles:
  - {name: default, deadline: 1m, queue_timeout: 5s, idle_timeout: 30s}
routes:
  - {name: fast, model: fast, targets: [{target: "llama3.2:latest", adapter: ollama}]}
  - {name: spread, model: spread, targets: [{target: "llama3.2:latest", nodes: [n1]}, {target: "qwen3:8b", nodes: [n2]}]}
`, quicPort, httpPort))
	start(t, "edged", bin.edged, "run", "--config", edgeConf)
	for id, f := range map[string]*fakeollama.Server{"n1": s.n1, "n2": s.n2} {
		conf := filepath.Join(dir, id+".yaml")
		writeFile(t, conf, fmt.Sprintf(`
node_id: %s
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
providers: [{name: ollama, adapter: ollama, capacity: 4, config: {base_url: %q}}]
`, id, quicPort, f.URL()))
		start(t, "noded "+id, bin.noded, "run", "--config", conf)
		waitNode(t, s.base, id, "ready with ollama online", func(n nodeView) bool {
			return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
		})
	}
	u, err := url.Parse(s.base)
	if err != nil {
		t.Fatal(err)
	}
	s.client = api.NewClient(u, http.DefaultClient)
	return s
}

// lastRequest is the last request fake f received for path.
func lastRequest(t *testing.T, f *fakeollama.Server, path string) fakeollama.Request {
	t.Helper()
	reqs := f.Requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		if reqs[i].Path == path {
			return reqs[i]
		}
	}
	t.Fatalf("the fake received no %s", path)
	return fakeollama.Request{}
}

// metrics is the Edge's /metrics text.
func (s *relayStack) metrics(t *testing.T) string {
	t.Helper()
	resp, err := http.Get(s.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// P2, issue 10 item 8: through an alias route the provider is asked for
// the route's target, in every tunnelled endpoint (show's deprecated
// "name" included), and the official client sees its own name in every
// answer; a name that is its target's ":latest" twin goes unchanged; when
// the first candidate refuses, the next gets the body with its own target.
func TestOllamaAliasRouteAsksTheProviderForTheTarget(t *testing.T) {
	s := startRelayStack(t)
	c := s.client
	hi := []api.Message{{Role: "user", Content: "Why is the sky blue?"}}

	var text strings.Builder
	var names []string
	err := c.Chat(t.Context(), &api.ChatRequest{Model: "fast", Messages: hi, Options: map[string]any{"temperature": 0.5}},
		func(r api.ChatResponse) error {
			text.WriteString(r.Message.Content)
			names = append(names, r.Model)
			return nil
		})
	if err != nil || text.String() != relayAnswer {
		t.Fatalf("chat: %q, %v", text.String(), err)
	}
	for _, n := range names {
		if n != "fast" {
			t.Fatalf("chunks named %v, want fast every time", names)
		}
	}
	var sent api.ChatRequest
	if err := lastRequest(t, s.n1, "/api/chat").Decode(&sent); err != nil {
		t.Fatal(err)
	}
	if sent.Model != "llama3.2:latest" || len(sent.Messages) != 1 || sent.Messages[0].Content != hi[0].Content || sent.Options["temperature"] != 0.5 {
		t.Errorf("the provider was asked %+v", sent)
	}

	stream := false
	err = c.Chat(t.Context(), &api.ChatRequest{Model: "fast", Messages: hi, Stream: &stream}, func(r api.ChatResponse) error {
		if r.Model != "fast" || r.Message.Content != relayAnswer {
			t.Errorf("whole chat answer %+v", r)
		}
		return nil
	})
	if err != nil {
		t.Errorf("chat without streaming: %v", err)
	}
	err = c.Generate(t.Context(), &api.GenerateRequest{Model: "fast", Prompt: "hi"}, func(r api.GenerateResponse) error {
		if r.Model != "fast" {
			t.Errorf("generate chunk named %q", r.Model)
		}
		return nil
	})
	if err != nil || lastRequest(t, s.n1, "/api/generate").Model != "llama3.2:latest" {
		t.Errorf("generate: %v; the provider was asked for %q", err, lastRequest(t, s.n1, "/api/generate").Model)
	}
	emb, err := c.Embed(t.Context(), &api.EmbedRequest{Model: "fast", Input: "a"})
	if err != nil || emb.Model != "fast" || len(emb.Embeddings) != 1 || lastRequest(t, s.n1, "/api/embed").Model != "llama3.2:latest" {
		t.Errorf("embed %+v, %v; the provider was asked for %q", emb, err, lastRequest(t, s.n1, "/api/embed").Model)
	}
	show, err := c.Show(t.Context(), &api.ShowRequest{Model: "fast"})
	if err != nil || !strings.Contains(show.Modelfile, "FROM llama3.2:latest") || lastRequest(t, s.n1, "/api/show").Model != "llama3.2:latest" {
		t.Errorf("show: %+v, %v", show, err)
	}
	// Older clients name the model in show's deprecated "name".
	resp, err := http.Post(s.base+"/api/show", "application/json", strings.NewReader(`{"name":"fast","verbose":false}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(lastRequest(t, s.n1, "/api/show").Body) != `{"name":"llama3.2:latest","verbose":false}` {
		t.Errorf("show by name: %d %s; the provider got %s", resp.StatusCode, b, lastRequest(t, s.n1, "/api/show").Body)
	}

	// No route: the name goes as the client wrote it, Ollama's own
	// ":latest" spelling being its to resolve.
	err = c.Chat(t.Context(), &api.ChatRequest{Model: "llama3.2", Messages: hi}, func(r api.ChatResponse) error {
		if r.Model != "llama3.2" {
			t.Errorf("chunk named %q", r.Model)
		}
		return nil
	})
	if req := lastRequest(t, s.n1, "/api/chat"); err != nil || req.Model != "llama3.2" {
		t.Errorf("chat llama3.2: %v; the provider was asked for %q", err, req.Model)
	}

	// Failover before the first byte: n1's server is down, so every
	// request ends on n2, which must be asked for its own target.
	if err := s.n1.SetMode(fakeollama.ModeRefuse); err != nil {
		t.Fatal(err)
	}
	s.n2.Reset()
	// The scheduler spreads by load and by what each Node served (n1 served
	// everything above): keep asking until a request has met n1, at most
	// 20, every one answered by n2.
	failedOver := func() bool {
		return metricValue(s.metrics(t), `iop_edge_failovers_total{reason="before_first_byte"}`) > 0
	}
	for i := 0; i < 6 || (i < 20 && !failedOver()); i++ {
		var names []string
		err := c.Chat(t.Context(), &api.ChatRequest{Model: "spread", Messages: hi}, func(r api.ChatResponse) error {
			names = append(names, r.Model)
			return nil
		})
		if err != nil || len(names) == 0 || names[0] != "spread" || names[len(names)-1] != "spread" {
			t.Fatalf("spread chat %d: names %v, %v", i, names, err)
		}
	}
	for _, r := range workOf(s.n2) {
		if r.Model != "qwen3:8b" {
			t.Errorf("n2 was asked for %q, want its target qwen3:8b", r.Model)
		}
	}
	if m := s.metrics(t); metricValue(m, `iop_edge_failovers_total{reason="before_first_byte"}`) == 0 {
		t.Errorf("no failover in 20 requests over two Nodes, one of them down:\n%s", grepLines(m, "iop_edge_failovers"))
	}
}

// R3, issue 10 item 8: a provider stream that completes without its done
// line ends with Ollama's error line, after the lines that came, so the
// official client reports an error instead of a success; the Edge counts
// it as incomplete_stream.
func TestOllamaStreamWithoutDoneLineIsAnError(t *testing.T) {
	s := startRelayStack(t)
	hi := []api.Message{{Role: "user", Content: "hi"}}
	chunks := 0
	err := s.client.Chat(t.Context(), &api.ChatRequest{Model: "cut", Messages: hi}, func(api.ChatResponse) error {
		chunks++
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "ended without its final message") || chunks != 3 {
		t.Errorf("chat: %d chunks, err %v; want 3 and the incomplete stream error", chunks, err)
	}
	err = s.client.Generate(t.Context(), &api.GenerateRequest{Model: "cut", Prompt: "hi"}, func(api.GenerateResponse) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "ended without its final message") {
		t.Errorf("generate: %v, want the incomplete stream error", err)
	}

	// On the wire: the provider's lines, then the error on a line of its own.
	resp, err := http.Post(s.base+"/api/chat", "application/json", strings.NewReader(`{"model":"cut","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if resp.StatusCode != 200 || len(lines) != 4 || !strings.HasPrefix(lines[0], `{"model":"cut"`) ||
		!strings.HasPrefix(lines[3], `{"error":"the provider's stream ended without its final message`) {
		t.Errorf("status %d, lines:\n%s", resp.StatusCode, strings.Join(lines, "\n"))
	}

	m := s.metrics(t)
	for _, series := range []string{
		`iop_edge_requests_total{model="cut",outcome="incomplete_stream",principal="anonymous",route="ollama_chat"} 2`,
		`iop_edge_requests_total{model="cut",outcome="incomplete_stream",principal="anonymous",route="ollama_generate"} 1`,
	} {
		if !strings.Contains(m, series) {
			t.Errorf("no %s in:\n%s", series, grepLines(m, "iop_edge_requests_total"))
		}
	}
	if strings.Contains(m, `outcome="ok",principal="anonymous",route="ollama_chat"}`) {
		t.Errorf("an incomplete stream counted ok:\n%s", grepLines(m, "iop_edge_requests_total"))
	}
}
