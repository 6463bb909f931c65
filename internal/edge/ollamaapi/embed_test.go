package ollamaapi

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/ollama/ollama/api"

	"github.com/iop-dev/iop/internal/edge/edgemetrics/metricstest"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// simulated is an inventory where m1 is served by the simulator alone,
// whose embedding calls end with emb.
func simulated(emb *dispatch.Embedding) *ft.Dispatcher {
	return &ft.Dispatcher{Offerings: []dispatch.Offering{ft.Offer("m1", "simulator")}, Embedding: emb}
}

// P2, issue 12: /api/embed on a model no Ollama server serves is an
// embedding call, answered in Ollama's shape with its counts; the legacy
// /api/embeddings answers one embedding.
func TestEmbedOnAModelNoOllamaServes(t *testing.T) {
	f := simulated(&dispatch.Embedding{ID: "emb-1",
		Vectors: []*wirepb.Vector{{Values: []float32{0.5, -1}}, {Values: []float32{0.25, 2}}},
		Terminal: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED,
			Usage: &wirepb.Usage{PromptTokens: 3, TotalDurationNs: 1500}}})
	e := newEnv(t, f)
	w := e.do(req(http.MethodPost, "/api/embed", `{"model":"m1","input":["a","b"],"dimensions":2,"truncate":false,"keep_alive":"5m"}`))
	if want := `{"model":"m1","embeddings":[[0.5,-1],[0.25,2]],"total_duration":1500,"prompt_eval_count":3}`; w.Code != http.StatusOK || w.Body.String() != want {
		t.Fatalf("%d\n got %s\nwant %s", w.Code, w.Body, want)
	}
	r := f.EmbedRequests()[0]
	if strings.Join(r.GetInputs(), ",") != "a,b" || r.GetDimensions() != 2 || string(r.GetExtraJson()) != `{"truncate":false}` {
		t.Errorf("request %v", r)
	}
	if len(e.runner.Starts()) != 0 {
		t.Error("the request was tunnelled")
	}
	w = e.do(req(http.MethodPost, "/api/embeddings", `{"model":"m1","prompt":"a"}`))
	if want := `{"embedding":[0.5,-1]}`; w.Code != http.StatusOK || w.Body.String() != want {
		t.Errorf("legacy: %d %s", w.Code, w.Body)
	}
	if got := f.EmbedRequests()[1].GetInputs(); len(got) != 1 || got[0] != "a" {
		t.Errorf("legacy inputs %q", got)
	}
	if got := metricstest.Sum(t, e.metrics.Requests, "route", routeEmbed, "outcome", "ok"); got != 1 {
		t.Errorf("requests{ollama_embed,ok} = %v", got)
	}
}

// A call without input is Ollama's "load the model": no embeddings, once
// the model can be scheduled; an unknown model is 404 in Ollama's words.
func TestEmbedLoadAndErrorsOnTheCallPath(t *testing.T) {
	f := simulated(nil)
	e := newEnv(t, f)
	if w := e.do(req(http.MethodPost, "/api/embed", `{"model":"m1"}`)); w.Code != http.StatusOK || w.Body.String() != `{"model":"m1","embeddings":[]}` || len(f.EmbedRequests()) != 0 {
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
		if w.Code != c.status || !strings.Contains(errorTextOf(t, w.Body.String()), c.says) {
			t.Errorf("%s: %d %s", c.body, w.Code, w.Body)
		}
	}
	f.EmbedErr = fmt.Errorf("%w: m1", dispatch.ErrUnsupported)
	if w := e.do(req(http.MethodPost, "/api/embed", `{"model":"m1","input":"a"}`)); w.Code != http.StatusBadRequest {
		t.Errorf("unsupported: %d %s", w.Code, w.Body)
	}
	f.Unknown = []string{"ghost"}
	f.EmbedErr = fmt.Errorf("%w: ghost", dispatch.ErrUnknownModel)
	w := e.do(req(http.MethodPost, "/api/embed", `{"model":"ghost","input":"a"}`))
	if w.Code != http.StatusNotFound || errorTextOf(t, w.Body.String()) != "model 'ghost' not found" {
		t.Errorf("unknown model: %d %s", w.Code, w.Body)
	}
}

// A model an Ollama server serves is still tunnelled, byte for byte.
func TestEmbedOnAnOllamaModelIsTunnelled(t *testing.T) {
	f := &ft.Dispatcher{Pieces: []ft.Step{ft.Line(`{"model":"m1","embeddings":[[1]]}`)}}
	e := newEnv(t, f)
	w := e.do(req(http.MethodPost, "/api/embed", `{"model":"m1","input":"a"}`))
	if w.Code != http.StatusOK || len(f.EmbedRequests()) != 0 || len(f.Starts()) != 1 {
		t.Errorf("%d %s, %d calls, %d tunnels", w.Code, w.Body, len(f.EmbedRequests()), len(f.Starts()))
	}
}

// P2, issue 12: a generate with a suffix (or raw) on a model no Ollama
// server serves is a raw completion run, for providers that complete; a
// system prompt or images with it are refused.
func TestGenerateWithASuffixIsARawCompletion(t *testing.T) {
	f := &ft.Dispatcher{Offerings: []dispatch.Offering{ft.Offer("m1", "openai")}, Events: []ft.Step{ft.Text("return a + b"), used(3, 4), ft.Completed("stop")}}
	c, _ := officialClient(t, f)
	var out strings.Builder
	err := c.Generate(t.Context(), &api.GenerateRequest{Model: "m1", Prompt: "def add(a, b):", Suffix: "print(add(1, 2))"},
		func(r api.GenerateResponse) error { out.WriteString(r.Response); return nil })
	if err != nil || out.String() != "return a + b" {
		t.Fatalf("%q, %v", out.String(), err)
	}
	req := f.RunRequests()[0]
	if c := req.GetCompletion(); c.GetPrompt() != "def add(a, b):" || c.GetSuffix() != "print(add(1, 2))" || len(req.GetMessages()) != 0 {
		t.Errorf("run %v", req)
	}
	if err := c.Generate(t.Context(), &api.GenerateRequest{Model: "m1", Prompt: "p", Raw: true}, func(api.GenerateResponse) error { return nil }); err != nil ||
		f.RunRequests()[1].GetCompletion().GetPrompt() != "p" {
		t.Errorf("raw: %v %v", err, f.RunRequests()[1])
	}
	err = c.Generate(t.Context(), &api.GenerateRequest{Model: "m1", Prompt: "p", Suffix: "s", System: "be brief"}, func(api.GenerateResponse) error { return nil })
	var se api.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusBadRequest || len(f.RunRequests()) != 2 {
		t.Errorf("a system prompt with a suffix: %v", err)
	}
}
