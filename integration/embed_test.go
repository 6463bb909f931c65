package integration

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
	"github.com/iop-dev/iop/plugins/simulator"
)

// Embeddings and text completions (issue 12) with the official clients,
// unchanged, against real edged and noded processes and their plugin
// processes, on three adapters: the ollama adapter in front of the fake
// Ollama, the openai adapter in front of the fake OpenAI-compatible
// server, and the simulator. An embedding call is its own kind of work on
// the Edge–Node wire; a text completion is a normalized run whose request
// is a raw completion (SPEC R2, P2).

// kindsStack is an Edge and a Node with three providers:
//
//	ollama  (ollama adapter, capacity 4)  fake Ollama: nomic-embed, coder,
//	        plain (no fill-in-the-middle), crashy (fails after 2 words)
//	compat  (openai adapter, capacity 1)  fake OpenAI: oa-embed, oa-coder,
//	        oa-plain (refuses a suffix), oa-flaky (fails after 2 chunks),
//	        oa-slow (answers after 2 s)
//	sim     (simulator, capacity 4)       sim-embed, sim-coder
//
// The default profile queues nothing (max_queue_depth 0): a second request
// while compat's one slot is busy is refused queue_full.
type kindsStack struct {
	base   string
	ollama *fakeollama.Server
	compat *fakeopenai.Server
}

func startKindsStack(t *testing.T) *kindsStack {
	t.Helper()
	s := &kindsStack{}
	s.ollama = fakeollama.New(
		fakeollama.Model{Name: "nomic-embed:latest", EmbeddingDims: 16},
		fakeollama.Model{Name: "coder:latest", Text: "return a + b"},
		fakeollama.Model{Name: "plain:latest", Text: "plain text", NoInsert: true},
		fakeollama.Model{Name: "crashy:latest", Text: "one two three four", ErrorMessage: "runner crashed", ErrorAfter: 2},
	)
	t.Cleanup(s.ollama.Close)
	s.compat = fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{
		{Name: "oa-embed", EmbeddingDims: 12},
		{Name: "oa-coder", Tokens: []string{"return", " a", " +", " b"}},
		{Name: "oa-plain", Tokens: []string{"x"}, NoSuffix: true},
		{Name: "oa-flaky", Tokens: []string{"one", " two", " three"}, Fail: &fakeopenai.Failure{MidStream: true, AfterChunks: 2, Message: "engine died"}},
		{Name: "oa-slow", Tokens: []string{"late"}, EmbeddingDims: 4, HeaderDelay: 2 * time.Second},
	}})
	t.Cleanup(s.compat.Close)

	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	edgeConf, nodeConf := filepath.Join(dir, "edge.yaml"), filepath.Join(dir, "node.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api: {allow_anonymous: true}
profiles: [{name: default, max_queue_depth: 0, queue_timeout: 5s}]
`, quicPort, httpPort))
	writeFile(t, nodeConf, fmt.Sprintf(`
node_id: n1
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
providers:
  - {name: ollama, adapter: ollama, capacity: 4, config: {base_url: %q}}
  - {name: compat, adapter: openai, capacity: 1, config: {base_url: %q}}
  - name: sim
    adapter: simulator
    capacity: 4
    config: {models: [{name: sim-embed, embedding_dims: 8}, {name: sim-coder, tokens: 6, token_interval: 1ms}]}
`, quicPort, s.ollama.URL(), s.compat.BaseURL()))
	s.base = fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	start(t, "edged", bin.edged, "run", "--config", edgeConf)
	start(t, "noded", bin.noded, "run", "--config", nodeConf)
	waitNode(t, s.base, "n1", "ready with its three providers online", func(n nodeView) bool {
		if n.State != "ready" || len(n.Providers) != 3 {
			return false
		}
		for _, p := range n.Providers {
			if p.State != "online" {
				return false
			}
		}
		return true
	})
	return s
}

// sdkClient is the official OpenAI SDK pointed at an Edge.
func sdkClient(base string) openai.Client {
	return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused-on-loopback"), option.WithMaxRetries(0))
}

// lastBody is the body of the last request a fake got on path.
func lastBody[R fakeollama.Request | fakeopenai.Request](t *testing.T, reqs []R, path string) map[string]any {
	t.Helper()
	for i := len(reqs) - 1; i >= 0; i-- {
		var p string
		var b []byte
		switch r := any(reqs[i]).(type) {
		case fakeollama.Request:
			p, b = r.Path, r.Body
		case fakeopenai.Request:
			p, b = r.Path, r.Body
		}
		if p == path {
			var body map[string]any
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatal(err)
			}
			return body
		}
	}
	t.Fatalf("no request on %s", path)
	return nil
}

// unitLength reports whether v has length 1.
func unitLength[F float32 | float64](v []F) bool {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Abs(s-1) < 1e-4
}

// P2, R2, issue 12: the official OpenAI SDK's Embeddings on each adapter:
// a batch gets one vector per input, in order (the same input, the same
// vector), with usage; dimensions shortens them; base64 is the same
// vector as little-endian float32. The vectors are the model server's,
// exactly, through the Node and the Edge.
func TestOfficialClientEmbeddingsOnEveryAdapter(t *testing.T) {
	s := startKindsStack(t)
	c := sdkClient(s.base)
	inputs := []string{"The quick brown fox.", "An Edge and its Nodes.", "The quick brown fox."}
	for _, m := range []struct {
		model string
		dims  int
		exact func(text string) []float32 // the server's own vector, when the test can know it
	}{
		{"nomic-embed", 16, nil},
		{"oa-embed", 12, func(text string) []float32 { return fakeopenai.Vector("oa-embed", text, 12) }},
		{"sim-embed", 8, func(text string) []float32 { return simulator.Vector("sim-embed", text, 8) }},
	} {
		t.Run(m.model, func(t *testing.T) {
			res, err := c.Embeddings.New(t.Context(), openai.EmbeddingNewParams{Model: m.model,
				Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: inputs}})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Data) != 3 || res.Model != m.model || res.Usage.PromptTokens == 0 || res.Usage.TotalTokens != res.Usage.PromptTokens {
				t.Fatalf("answer %s", res.RawJSON())
			}
			for i, d := range res.Data {
				if d.Index != int64(i) || len(d.Embedding) != m.dims || !unitLength(d.Embedding) {
					t.Fatalf("embedding %d: index %d, %d values", i, d.Index, len(d.Embedding))
				}
			}
			if !slices.Equal(res.Data[0].Embedding, res.Data[2].Embedding) || slices.Equal(res.Data[0].Embedding, res.Data[1].Embedding) {
				t.Errorf("the same input got another vector, or two inputs the same one")
			}
			if m.exact != nil {
				for i, d := range res.Data {
					for j, want := range m.exact(inputs[i]) {
						if float32(d.Embedding[j]) != want {
							t.Fatalf("vector %d differs from the server's at %d: %v, want %v", i, j, d.Embedding[j], want)
						}
					}
				}
			}

			short, err := c.Embeddings.New(t.Context(), openai.EmbeddingNewParams{Model: m.model, Dimensions: openai.Int(4),
				Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String(inputs[1])}})
			if err != nil || len(short.Data) != 1 || len(short.Data[0].Embedding) != 4 || !unitLength(short.Data[0].Embedding) {
				t.Errorf("dimensions 4: %v, %v", short, err)
			}

			b64, err := c.Embeddings.New(t.Context(), openai.EmbeddingNewParams{Model: m.model,
				EncodingFormat: openai.EmbeddingNewParamsEncodingFormatBase64,
				Input:          openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: inputs[:2]}})
			if err != nil || len(b64.Data) != 2 {
				t.Fatalf("base64: %v", err)
			}
			for i, d := range b64.Data {
				var enc string
				if err := json.Unmarshal([]byte(d.JSON.Embedding.Raw()), &enc); err != nil {
					t.Fatalf("base64 embedding %s: %v", d.JSON.Embedding.Raw(), err)
				}
				raw, err := base64.StdEncoding.DecodeString(enc)
				if err != nil || len(raw) != 4*m.dims {
					t.Fatalf("base64 embedding of %d bytes: %v", len(raw), err)
				}
				for j, want := range res.Data[i].Embedding {
					if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:])); got != float32(want) {
						t.Fatalf("base64 vector %d differs at %d: %v, want %v", i, j, got, want)
					}
				}
			}
		})
	}
	// The fake OpenAI server got the dimensions, in float, and the fake
	// Ollama its own /api/embed with them.
	if body := lastBody(t, s.compat.Requests(), "/v1/embeddings"); body["encoding_format"] != "float" {
		t.Errorf("the OpenAI-compatible server got %v", body)
	}
	if body := lastBody(t, s.ollama.Requests(), "/api/embed"); len(body["input"].([]any)) != 2 {
		t.Errorf("Ollama got %v", body)
	}
}

// P1, P2, issue 12: what goes wrong reaches the OpenAI SDK as its own
// error: an unknown model is a 404 model_not_found, token arrays a 400
// naming input, and a refusal (the provider's one slot busy, no queue) a
// 429 queue_full with its header.
func TestOfficialClientEmbeddingErrors(t *testing.T) {
	s := startKindsStack(t)
	c := sdkClient(s.base)
	text := openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}
	var apiErr *openai.Error
	_, err := c.Embeddings.New(t.Context(), openai.EmbeddingNewParams{Model: "no-such-model", Input: text})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Errorf("unknown model: %v", err)
	}
	_, err = c.Embeddings.New(t.Context(), openai.EmbeddingNewParams{Model: "oa-embed",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfTokens: []int64{1, 2, 3}}})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "input" {
		t.Errorf("token arrays: %v", err)
	}

	done := make(chan error, 1)
	go func() {
		_, err := c.Embeddings.New(t.Context(), openai.EmbeddingNewParams{Model: "oa-slow", Input: text})
		done <- err
	}()
	waitFor(t, "the first call holding compat's slot", func() bool { return queuedOrRunning(t, s.base) == 1 })
	_, err = c.Embeddings.New(t.Context(), openai.EmbeddingNewParams{Model: "oa-slow", Input: text})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "queue_full" ||
		apiErr.Response.Header.Get("X-Iop-Refusal") != "queue_full" {
		t.Errorf("refusal: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("the call holding the slot: %v", err)
	}
}

// P2, issue 12: the official Ollama client's Embed on each adapter: a
// model on the fake Ollama is tunnelled to it, a model on the fake OpenAI
// server or the simulator is an embedding call written in Ollama's shape;
// the legacy Embeddings too. An unknown model is Ollama's 404.
func TestOllamaClientEmbedOnEveryAdapter(t *testing.T) {
	s := startKindsStack(t)
	c := ollamaClient(t, s.base)
	for _, m := range []struct {
		model string
		dims  int
	}{{"nomic-embed", 16}, {"oa-embed", 12}, {"sim-embed", 8}} {
		res, err := c.Embed(t.Context(), &api.EmbedRequest{Model: m.model, Input: []string{"a b", "c"}})
		if err != nil || len(res.Embeddings) != 2 || len(res.Embeddings[0]) != m.dims || res.PromptEvalCount == 0 {
			t.Errorf("%s: %+v, %v", m.model, res, err)
			continue
		}
		short, err := c.Embed(t.Context(), &api.EmbedRequest{Model: m.model, Input: "a b", Dimensions: 4})
		if err != nil || len(short.Embeddings) != 1 || len(short.Embeddings[0]) != 4 || !unitLength(short.Embeddings[0]) {
			t.Errorf("%s, dimensions 4: %+v, %v", m.model, short, err)
		}
		legacy, err := c.Embeddings(t.Context(), &api.EmbeddingRequest{Model: m.model, Prompt: "a b"})
		if err != nil || len(legacy.Embedding) != m.dims {
			t.Errorf("%s, legacy: %+v, %v", m.model, legacy, err)
			continue
		}
		for i, v := range legacy.Embedding {
			if float32(v) != res.Embeddings[0][i] {
				t.Errorf("%s: the legacy embedding of an input is not its /api/embed one", m.model)
				break
			}
		}
	}
	if got := s.compat.Requests(); len(got) == 0 {
		t.Error("the OpenAI-compatible server got nothing")
	}
	_, err := c.Embed(t.Context(), &api.EmbedRequest{Model: "no-such-model", Input: "x"})
	var se api.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusNotFound {
		t.Errorf("unknown model: %v", err)
	}
}
