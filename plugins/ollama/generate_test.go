package ollama

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/sdk"
)

// P2, issue 12: a raw completion goes to Ollama's /api/generate with its
// prompt, suffix and options (raw from Extra, and Extra's other fields at
// the top level, issue 21), and streams like a chat.
func TestCompleteUsesGenerateWithTheSuffix(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "coder:latest", Text: "return a + b"})
	a := newAdapter(t, f.URL(), map[string]any{"keep_alive": "10m"})
	max := int64(20)
	req := &sdk.Request{Target: "coder", Prompt: "def add(a, b):", Suffix: "print(add(1, 2))",
		Options: sdk.Options{MaxTokens: &max, Stop: []string{"\n\n"}, Extra: json.RawMessage(`{"raw":true,"presence_penalty":0.5,"user":"u"}`)}}
	var out sink
	res, err := a.Complete(ctxTimeout(t, 5*time.Second), req, &out)
	if err != nil || out.text(sdk.TextDelta) != "return a + b" || res.DoneReason != "stop" || res.Usage.CompletionTokens == 0 {
		t.Fatalf("%q, %+v, %v", out.text(sdk.TextDelta), res, err)
	}
	got := lastRequest(t, f)
	var body map[string]any
	if err := json.Unmarshal(got.Body, &body); err != nil || got.Path != "/api/generate" {
		t.Fatalf("%s %s: %v", got.Path, got.Body, err)
	}
	opts, _ := body["options"].(map[string]any)
	if body["prompt"] != "def add(a, b):" || body["suffix"] != "print(add(1, 2))" || body["stream"] != true || body["raw"] != true ||
		body["keep_alive"] != "10m" || opts["num_predict"] != float64(20) || opts["presence_penalty"] != 0.5 || body["user"] != "u" {
		t.Errorf("body %s", got.Body)
	}
}

// Ollama's 400 for a model without fill-in-the-middle is unsupported; an
// error line mid-answer fails the call as a chat's does.
func TestCompleteFailures(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "plain:latest", NoInsert: true},
		fakeollama.Model{Name: "crashy:latest", ErrorMessage: "runner crashed", ErrorAfter: 2})
	a := newAdapter(t, f.URL(), nil)
	ctx := ctxTimeout(t, 5*time.Second)
	if _, err := a.Complete(ctx, &sdk.Request{Target: "plain", Prompt: "x", Suffix: "y"}, &sink{}); !errors.Is(err, sdk.ErrUnsupported) {
		t.Errorf("a suffix on a model without insert: %v", err)
	}
	if _, err := a.Complete(ctx, &sdk.Request{Target: "plain", Prompt: "x"}, &sink{}); err != nil {
		t.Errorf("the same model without a suffix: %v", err)
	}
	var out sink
	if _, err := a.Complete(ctx, &sdk.Request{Target: "crashy", Prompt: "x"}, &out); !errors.Is(err, sdk.ErrUpstream) || out.text(sdk.TextDelta) == "" {
		t.Errorf("an error line after output: %v (text %q)", err, out.text(sdk.TextDelta))
	}
	if _, err := a.Complete(ctx, &sdk.Request{Target: "nope", Prompt: "x"}, &sink{}); !errors.Is(err, sdk.ErrModelNotFound) {
		t.Errorf("an unknown model: %v", err)
	}
}

// P2, issue 12: embeddings come from Ollama's /api/embed, with the
// dimensions, truncate, options and Extra's other fields passed on, and
// the counts as usage.
func TestEmbedUsesOllamasEmbed(t *testing.T) {
	f := newFake(t, fakeollama.Model{Name: "nomic:latest", EmbeddingDims: 16}, fakeollama.Model{Name: "down:latest", FailStatus: 503, FailMessage: "overloaded"})
	a := newAdapter(t, f.URL(), nil)
	ctx := ctxTimeout(t, 5*time.Second)
	res, err := a.Embed(ctx, &sdk.EmbedRequest{Target: "nomic", Inputs: []string{"a b", "c"}, Dimensions: 4,
		Extra: json.RawMessage(`{"truncate":false,"options":{"num_ctx":512},"user":"u"}`)})
	if err != nil || len(res.Vectors) != 2 || len(res.Vectors[0]) != 4 || res.Usage.PromptTokens != 3 {
		t.Fatalf("%+v, %v", res, err)
	}
	var norm float64
	for _, v := range res.Vectors[1] {
		norm += float64(v) * float64(v)
	}
	if math.Abs(norm-1) > 1e-5 {
		t.Errorf("length² %v", norm)
	}
	got := lastRequest(t, f)
	var body map[string]any
	_ = json.Unmarshal(got.Body, &body)
	if got.Path != "/api/embed" || body["dimensions"] != float64(4) || body["truncate"] != false || body["user"] != "u" ||
		body["options"].(map[string]any)["num_ctx"] != float64(512) {
		t.Errorf("%s %s", got.Path, got.Body)
	}
	if _, err := a.Embed(ctx, &sdk.EmbedRequest{Target: "down", Inputs: []string{"x"}}); !errors.Is(err, sdk.ErrUnavailable) {
		t.Errorf("503: %v", err)
	}
	if _, err := a.Embed(ctx, &sdk.EmbedRequest{Target: "nope", Inputs: []string{"x"}}); !errors.Is(err, sdk.ErrModelNotFound) {
		t.Errorf("unknown model: %v", err)
	}
}
