package openaiapi

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/edgemetrics/metricstest"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

func embedEnv(t *testing.T, f *ft.Dispatcher) (http.Handler, *edgemetrics.Metrics) {
	t.Helper()
	e := newEnv(t, f)
	return e.handler, e.metrics
}

func embedReq(h http.Handler, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/embeddings", strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+testKey)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// P2, issue 12: POST /v1/embeddings dispatches one embedding call with
// the inputs, dimensions and the fields the Edge does not read, and
// answers OpenAI's list of embeddings with the usage.
func TestEmbeddingsAnswerOpenAIsList(t *testing.T) {
	f := &ft.Dispatcher{Embedding: ft.Embedded(3, []float32{0.5, -1}, []float32{0.25, 1e-7})}
	h, m := embedEnv(t, f)
	w := embedReq(h, `{"model":"m1","input":["a","b"],"dimensions":2,"user":"u1"}`)
	want := `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,-1]},` +
		`{"object":"embedding","index":1,"embedding":[0.25,1e-07]}],"model":"m1","usage":{"prompt_tokens":3,"total_tokens":3}}`
	if w.Code != http.StatusOK || compact(t, w.Body.String()) != want || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("%d\n got %s\nwant %s", w.Code, w.Body, want)
	}
	req := f.EmbedRequests()[0]
	if strings.Join(req.GetInputs(), ",") != "a,b" || req.GetDimensions() != 2 || string(req.GetExtraJson()) != `{"user":"u1"}` {
		t.Errorf("request %v", req)
	}
	if got := metricstest.Sum(t, m.Requests, "route", routeEmbeddings, "outcome", "ok"); got != 1 {
		t.Errorf("requests{openai_embeddings,ok} = %v", got)
	}
	// A string is one input.
	embedReq(h, `{"model":"m1","input":"one"}`)
	if got := f.EmbedRequests()[1].GetInputs(); len(got) != 1 || got[0] != "one" {
		t.Errorf("inputs %q", got)
	}
}

// encoding_format base64 is each vector's float32 values, little-endian,
// in standard base64, as OpenAI sends it.
func TestEmbeddingsInBase64AreLittleEndianFloat32(t *testing.T) {
	vec := []float32{0.1, -2.5, float32(math.Pi)}
	f := &ft.Dispatcher{Embedding: ft.Embedded(1, vec)}
	h, _ := embedEnv(t, f)
	w := embedReq(h, `{"model":"m1","input":"x","encoding_format":"base64"}`)
	var resp struct {
		Data []struct{ Embedding string }
	}
	if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil || len(resp.Data) != 1 {
		t.Fatalf("%d %s: %v", w.Code, w.Body, err)
	}
	raw, err := base64.StdEncoding.DecodeString(resp.Data[0].Embedding)
	if err != nil || len(raw) != 4*len(vec) {
		t.Fatalf("%q: %v", resp.Data[0].Embedding, err)
	}
	for i, want := range vec {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])); got != want {
			t.Errorf("value %d = %v, want %v", i, got, want)
		}
	}
}

// What cannot be embedded is a 400 naming the param, before any call.
func TestEmbeddingsRequestsThatCannotRun(t *testing.T) {
	many := `"x"` + strings.Repeat(`,"x"`, wirepb.MaxEmbedInputs)
	for _, c := range []struct{ body, param string }{
		{`{"model":"m1"}`, "input"},
		{`{"model":"m1","input":""}`, "input"},
		{`{"model":"m1","input":[]}`, "input"},
		{`{"model":"m1","input":["a",""]}`, "input"},
		{`{"model":"m1","input":[1,2,3]}`, "input"},
		{`{"model":"m1","input":[[1,2]]}`, "input"},
		{`{"model":"m1","input":[` + many + `]}`, "input"},
		{`{"model":"m1","input":"a","dimensions":0}`, "dimensions"},
		{`{"model":"m1","input":"a","encoding_format":"int8"}`, "encoding_format"},
		{`{"input":"a"}`, "model"},
	} {
		f := &ft.Dispatcher{}
		h, _ := embedEnv(t, f)
		w := embedReq(h, c.body)
		if w.Code != http.StatusBadRequest || paramOf(apiErrorOf(t, w.Body.String())) != c.param || len(f.EmbedRequests()) != 0 {
			t.Errorf("%.80s: %d %s; want 400 naming %s", c.body, w.Code, w.Body, c.param)
		}
	}
}

// Failures map as every API's do: an unknown model 404 model_not_found, a
// model no adapter embeds with 400 unsupported, a refusal 429 with its
// reason, a provider's failure by its kind.
func TestEmbeddingsFailuresHaveOpenAIsShape(t *testing.T) {
	failed := &dispatch.Embedding{Terminal: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
		Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_RATE_LIMITED, Message: "slow down"}}}
	for _, c := range []struct {
		name   string
		f      *ft.Dispatcher
		status int
		code   string
	}{
		{"unknown model", &ft.Dispatcher{EmbedErr: fmt.Errorf("%w: m1", dispatch.ErrUnknownModel)}, 404, "model_not_found"},
		{"no adapter embeds", &ft.Dispatcher{EmbedErr: fmt.Errorf("%w: m1", dispatch.ErrUnsupported)}, 400, "unsupported"},
		{"queue full", &ft.Dispatcher{EmbedErr: &sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "m1"}}, 429, "queue_full"},
		{"rate limited", &ft.Dispatcher{Embedding: failed}, 429, "rate_limited"},
	} {
		h, _ := embedEnv(t, c.f)
		w := embedReq(h, `{"model":"m1","input":"a"}`)
		if w.Code != c.status || codeOf(apiErrorOf(t, w.Body.String())) != c.code {
			t.Errorf("%s: %d %s; want %d %s", c.name, w.Code, w.Body, c.status, c.code)
		}
	}
	w := newEnv(t, &ft.Dispatcher{}).do(httptest.NewRequest(http.MethodPost, "/v1/embeddings", strings.NewReader(`{}`)))
	if w.Code != http.StatusUnauthorized {
		t.Errorf("unauthenticated: %d", w.Code)
	}
}
