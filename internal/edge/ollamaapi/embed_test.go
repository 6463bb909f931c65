package ollamaapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/gateway"
	"github.com/iop-dev/iop/internal/edge/metrics"
	"github.com/iop-dev/iop/internal/edge/metrics/metricstest"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// fakeEmbedder is a fake runner that also embeds: each call gets emb, or
// fails with err.
type fakeEmbedder struct {
	*fakeRunner
	emb  *gateway.Embedding
	err  error
	reqs []*wirepb.EmbedRequest
}

func (f *fakeEmbedder) Embed(_ context.Context, _ auth.Principal, _ string, req *wirepb.EmbedRequest, admitted, _ func()) (*gateway.Embedding, error) {
	f.reqs = append(f.reqs, req)
	if f.err != nil {
		return nil, f.err
	}
	admitted()
	return f.emb, nil
}

func embedEnv(t *testing.T, f *fakeEmbedder) *env {
	t.Helper()
	m := metrics.New(nil, nil)
	return &env{runner: f.fakeRunner, metrics: m, handler: Handler(f, testAuth(t), m, nil, nil)}
}

// simulated is an inventory where m1 is served by the simulator alone.
func simulated() *fakeRunner {
	return &fakeRunner{inventory: []gateway.Offering{offering("m1", "simulator")}}
}

// P2, issue 12: /api/embed on a model no Ollama server serves is an
// embedding call, answered in Ollama's shape with its counts; the legacy
// /api/embeddings answers one embedding.
func TestEmbedOnAModelNoOllamaServes(t *testing.T) {
	f := &fakeEmbedder{fakeRunner: simulated(), emb: &gateway.Embedding{ID: "emb-1",
		Vectors: []*wirepb.Vector{{Values: []float32{0.5, -1}}, {Values: []float32{0.25, 2}}},
		Terminal: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED,
			Usage: &wirepb.Usage{PromptTokens: 3, TotalDurationNs: 1500}}}}
	e := embedEnv(t, f)
	w := e.do(req(http.MethodPost, "/api/embed", `{"model":"m1","input":["a","b"],"dimensions":2,"truncate":false,"keep_alive":"5m"}`))
	if want := `{"model":"m1","embeddings":[[0.5,-1],[0.25,2]],"total_duration":1500,"prompt_eval_count":3}`; w.Code != http.StatusOK || w.Body.String() != want {
		t.Fatalf("%d\n got %s\nwant %s", w.Code, w.Body, want)
	}
	r := f.reqs[0]
	if strings.Join(r.GetInputs(), ",") != "a,b" || r.GetDimensions() != 2 || string(r.GetExtraJson()) != `{"truncate":false}` {
		t.Errorf("request %v", r)
	}
	if len(e.runner.starts) != 0 {
		t.Error("the request was tunnelled")
	}
	w = e.do(req(http.MethodPost, "/api/embeddings", `{"model":"m1","prompt":"a"}`))
	if want := `{"embedding":[0.5,-1]}`; w.Code != http.StatusOK || w.Body.String() != want {
		t.Errorf("legacy: %d %s", w.Code, w.Body)
	}
	if got := f.reqs[1].GetInputs(); len(got) != 1 || got[0] != "a" {
		t.Errorf("legacy inputs %q", got)
	}
	if got := metricstest.Sum(t, e.metrics.Requests, "route", routeEmbed, "outcome", "ok"); got != 1 {
		t.Errorf("requests{ollama_embed,ok} = %v", got)
	}
}

// A call without input is Ollama's "load the model": no embeddings, once
// the model can be scheduled; an unknown model is 404 in Ollama's words.
func TestEmbedLoadAndErrorsOnTheCallPath(t *testing.T) {
	f := &fakeEmbedder{fakeRunner: simulated()}
	e := embedEnv(t, f)
	if w := e.do(req(http.MethodPost, "/api/embed", `{"model":"m1"}`)); w.Code != http.StatusOK || w.Body.String() != `{"model":"m1","embeddings":[]}` || len(f.reqs) != 0 {
		t.Errorf("load: %d %s", w.Code, w.Body)
	}
	for _, c := range []struct {
		body   string
		status int
		says   string
	}{
		{`{"model":"m1","input":[1,2]}`, 400, "invalid input type"},
		{`{"model":"m1","input":["a",""]}`, 400, "input[1] is empty"},
		{`{"model":"m1","input":"a","dimensions":-1}`, 400, "dimensions"},
	} {
		w := e.do(req(http.MethodPost, "/api/embed", c.body))
		if w.Code != c.status || !strings.Contains(errorOf(t, w.Body.String()), c.says) {
			t.Errorf("%s: %d %s", c.body, w.Code, w.Body)
		}
	}
	f.err = fmt.Errorf("%w: m1", gateway.ErrUnsupported)
	if w := e.do(req(http.MethodPost, "/api/embed", `{"model":"m1","input":"a"}`)); w.Code != http.StatusBadRequest {
		t.Errorf("unsupported: %d %s", w.Code, w.Body)
	}
	f.fakeRunner.unknown = []string{"ghost"}
	f.err = fmt.Errorf("%w: ghost", gateway.ErrUnknownModel)
	w := e.do(req(http.MethodPost, "/api/embed", `{"model":"ghost","input":"a"}`))
	if w.Code != http.StatusNotFound || errorOf(t, w.Body.String()) != "model 'ghost' not found" {
		t.Errorf("unknown model: %d %s", w.Code, w.Body)
	}
}

// A model an Ollama server serves is still tunnelled, byte for byte.
func TestEmbedOnAnOllamaModelIsTunnelled(t *testing.T) {
	f := &fakeEmbedder{fakeRunner: &fakeRunner{pieces: []piece{line(`{"model":"m1","embeddings":[[1]]}`)}}}
	e := embedEnv(t, f)
	w := e.do(req(http.MethodPost, "/api/embed", `{"model":"m1","input":"a"}`))
	if w.Code != http.StatusOK || len(f.reqs) != 0 || len(f.fakeRunner.starts) != 1 {
		t.Errorf("%d %s, %d calls, %d tunnels", w.Code, w.Body, len(f.reqs), len(f.fakeRunner.starts))
	}
}

// P2, issue 12: a generate with a suffix (or raw) on a model no Ollama
// server serves is a raw completion run, for providers that complete; a
// system prompt or images with it are refused.
func TestGenerateWithASuffixIsARawCompletion(t *testing.T) {
	f := &fakeRunner{inventory: []gateway.Offering{offering("m1", "openai")}, events: []runStep{text("return a + b"), used(3, 4), finished("stop")}}
	c, _ := officialClient(t, f)
	var out strings.Builder
	err := c.Generate(t.Context(), &api.GenerateRequest{Model: "m1", Prompt: "def add(a, b):", Suffix: "print(add(1, 2))"},
		func(r api.GenerateResponse) error { out.WriteString(r.Response); return nil })
	if err != nil || out.String() != "return a + b" {
		t.Fatalf("%q, %v", out.String(), err)
	}
	req := f.runReqs[0]
	if c := req.GetCompletion(); c.GetPrompt() != "def add(a, b):" || c.GetSuffix() != "print(add(1, 2))" || len(req.GetMessages()) != 0 {
		t.Errorf("run %v", req)
	}
	if err := c.Generate(t.Context(), &api.GenerateRequest{Model: "m1", Prompt: "p", Raw: true}, func(api.GenerateResponse) error { return nil }); err != nil ||
		f.runReqs[1].GetCompletion().GetPrompt() != "p" {
		t.Errorf("raw: %v %v", err, f.runReqs[1])
	}
	err = c.Generate(t.Context(), &api.GenerateRequest{Model: "m1", Prompt: "p", Suffix: "s", System: "be brief"}, func(api.GenerateResponse) error { return nil })
	var se api.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusBadRequest || len(f.runReqs) != 2 {
		t.Errorf("a system prompt with a suffix: %v", err)
	}
}
