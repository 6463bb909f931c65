package openai_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
	"github.com/iop-dev/iop/sdk"
)

// lastBody decodes the fake's last request body.
func lastBody(t *testing.T, s *fakeopenai.Server) (string, map[string]any) {
	t.Helper()
	reqs := s.Requests()
	last := reqs[len(reqs)-1]
	var body map[string]any
	if err := json.Unmarshal(last.Body, &body); err != nil {
		t.Fatal(err)
	}
	return last.Path, body
}

// P2, issue 12: a raw completion is a streamed text completion with the
// prompt, the suffix, the options and the client's other fields; its text
// arrives as text deltas, the usage and finish reason as a run's.
func TestCompleteStreamsATextCompletion(t *testing.T) {
	s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "coder", Tokens: []string{"return", " a", " +", " b"}}}})
	a := configured(t, s.BaseURL())
	max := int64(3)
	var out sink
	res, err := a.Complete(t.Context(), &sdk.Request{Target: "coder", Prompt: "def add(a, b):", Suffix: "print(add(1, 2))",
		Options: sdk.Options{MaxTokens: &max, Extra: json.RawMessage(`{"best_of":2}`)}}, &out)
	if err != nil || summary(out.all()) != "t:return t: a t: + u:3/3" || res.DoneReason != "length" {
		t.Fatalf("%s, %+v, %v", summary(out.all()), res, err)
	}
	path, body := lastBody(t, s)
	if path != "/v1/completions" || body["prompt"] != "def add(a, b):" || body["suffix"] != "print(add(1, 2))" || body["stream"] != true ||
		body["max_tokens"] != float64(3) || body["best_of"] != float64(2) || body["stream_options"].(map[string]any)["include_usage"] != true {
		t.Errorf("%s %v", path, body)
	}
}

// A server that cannot do the work says so in its own way; each is
// unsupported: a refused suffix, a missing endpoint. An unknown model
// stays model_not_found, and a failure after output is upstream.
func TestCompleteFailuresMapToKinds(t *testing.T) {
	s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{
		{Name: "plain", NoSuffix: true},
		{Name: "flaky", Tokens: []string{"a", "b", "c"}, Fail: &fakeopenai.Failure{MidStream: true, AfterChunks: 2, Message: "boom"}},
	}})
	a := configured(t, s.BaseURL())
	bare := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"detail":"Not Found"}`))
	}))
	t.Cleanup(bare.Close)
	chatOnly := configured(t, bare.URL+"/v1")
	for _, c := range []struct {
		name string
		a    sdk.Completer
		req  *sdk.Request
		want error
	}{
		{"suffix refused", a, &sdk.Request{Target: "plain", Prompt: "x", Suffix: "y"}, sdk.ErrUnsupported},
		{"no endpoint", chatOnly, &sdk.Request{Target: "plain", Prompt: "x"}, sdk.ErrUnsupported},
		{"unknown model", a, &sdk.Request{Target: "nope", Prompt: "x"}, sdk.ErrModelNotFound},
		{"mid-stream", a, &sdk.Request{Target: "flaky", Prompt: "x"}, sdk.ErrUpstream},
	} {
		if _, err := c.a.Complete(t.Context(), c.req, &sink{}); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := chatOnly.Embed(t.Context(), &sdk.EmbedRequest{Target: "m", Inputs: []string{"x"}}); !errors.Is(err, sdk.ErrUnsupported) {
		t.Errorf("embeddings on a server without them: %v", err)
	}
}

// P2, issue 12: embeddings come from the server's /embeddings: the inputs,
// float encoding, the dimensions and the client's other fields; the
// vectors in input order, the usage.
func TestEmbedUsesTheEmbeddingsEndpoint(t *testing.T) {
	s := startFake(t, fakeopenai.Config{Models: []fakeopenai.Model{{Name: "emb", EmbeddingDims: 8},
		{Name: "busy", Fail: &fakeopenai.Failure{Status: 429, Message: "Rate limit reached"}}}})
	a := configured(t, s.BaseURL())
	res, err := a.Embed(t.Context(), &sdk.EmbedRequest{Target: "emb", Inputs: []string{"a b", "c"}, Dimensions: 8,
		Extra: json.RawMessage(`{"user":"u1"}`)})
	if err != nil || len(res.Vectors) != 2 || !slices.Equal(res.Vectors[1], fakeopenai.Vector("emb", "c", 8)) || res.Usage.PromptTokens != 3 {
		t.Fatalf("%+v, %v", res, err)
	}
	path, body := lastBody(t, s)
	if path != "/v1/embeddings" || body["encoding_format"] != "float" || body["dimensions"] != float64(8) || body["user"] != "u1" {
		t.Errorf("%s %v", path, body)
	}
	if _, err := a.Embed(t.Context(), &sdk.EmbedRequest{Target: "busy", Inputs: []string{"x"}}); !errors.Is(err, sdk.ErrRateLimited) {
		t.Errorf("429: %v", err)
	}
	if _, err := a.Embed(t.Context(), &sdk.EmbedRequest{Target: "nope", Inputs: []string{"x"}}); !errors.Is(err, sdk.ErrModelNotFound) {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := a.Embed(t.Context(), &sdk.EmbedRequest{Target: "emb", Inputs: []string{"x"}, Extra: json.RawMessage(`{"input":"y"}`)}); !errors.Is(err, sdk.ErrInvalidRequest) {
		t.Errorf("extra setting input: %v", err)
	}
}
