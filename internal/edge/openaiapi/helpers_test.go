package openaiapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/edgemetrics/metricstest"
)

const testKey = "sk-test-0123456789"

// testAuth accepts testKey only.
func testAuth(t *testing.T) *auth.Authenticator {
	t.Helper()
	c := edgeconfig.Default()
	c.Principals = []edgeconfig.Principal{{Name: "tester", Routes: []string{edgeconfig.AllRoutes}}}
	c.API.Keys = []edgeconfig.APIKey{{Principal: "tester", SHA256: auth.HashKey(testKey)}}
	closed := false
	c.API.AllowAnonymous = &closed
	a, err := auth.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// env is the API over a fake dispatcher, with its metrics.
type env struct {
	runner  *ft.Dispatcher
	metrics *edgemetrics.Metrics
	handler http.Handler
}

func newEnv(t *testing.T, f *ft.Dispatcher) *env {
	t.Helper()
	m := edgemetrics.New(nil, nil)
	return &env{runner: f, metrics: m, handler: Handler(frontend.New(f, testAuth(t), frontend.Options{Metrics: m,
		Door: frontdoor.New(frontdoor.Limits{MaxRequest: testMaxRequest}, nil)}))}
}

// chatRequest builds an authenticated chat request with body.
func chatReq(body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+testKey)
	r.Header.Set("Content-Type", "application/json")
	return r
}

// do serves r in-process and returns the recorded response.
func (e *env) do(r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	e.handler.ServeHTTP(w, r)
	return w
}

const (
	streamBody      = `{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	streamUsageBody = `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	plainBody       = `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`
)

// events splits a server-sent event stream into its data payloads, failing
// on anything that is not "data: ...\n\n".
func events(t *testing.T, body string) []string {
	t.Helper()
	if !strings.HasSuffix(body, "\n\n") {
		t.Fatalf("stream does not end with a blank line: %q", body)
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("malformed event %q", ev)
		}
		out = append(out, data)
	}
	return out
}

// compact re-encodes JSON without whitespace, for exact comparison.
func compact(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("not JSON: %v: %s", err, s)
	}
	return b.String()
}

// apiErrorOf decodes an OpenAI error body.
func apiErrorOf(t *testing.T, body string) errorBody {
	t.Helper()
	var b errorBody
	if err := json.Unmarshal([]byte(body), &b); err != nil || b.Error.Message == "" || b.Error.Type == "" {
		t.Fatalf("not an OpenAI error (%v): %s", err, body)
	}
	return b
}

func codeOf(b errorBody) string {
	if b.Error.Code == nil {
		return ""
	}
	return *b.Error.Code
}

func paramOf(b errorBody) string {
	if b.Error.Param == nil {
		return ""
	}
	return *b.Error.Param
}

// value reads a counter or gauge child.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	case d.Histogram != nil:
		return float64(d.Histogram.GetSampleCount())
	}
	t.Fatalf("unexpected metric %v", &d)
	return 0
}

// requests is metrics.Requests for the chat route and outcome.
func (e *env) requests(t *testing.T, outcome string) float64 {
	return metricstest.Sum(t, e.metrics.Requests, "route", routeChat, "outcome", outcome)
}

// cancellations is metrics.Cancellations for cause.
func (e *env) cancellations(t *testing.T, cause string) float64 {
	return value(t, e.metrics.Cancellations.WithLabelValues(cause))
}

// activeRuns is metrics.Active for runs.
func (e *env) activeRuns(t *testing.T) float64 {
	return value(t, e.metrics.Active.WithLabelValues("run"))
}

// ttftCount is how many times to first token were observed.
func (e *env) ttftCount(t *testing.T) float64 {
	return metricstest.Sum(t, e.metrics.TimeToFirstToken, "route", routeChat)
}

// testMaxRequest is the Edge's request limit (limits.max_request_mib) in
// these tests: small, so that bounds are tested at a size that is quick to
// build.
const testMaxRequest = 2 << 20
