package ollamaapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/edgemetrics/metricstest"
)

// TestMain fails the package if a test leaves a goroutine behind: a
// handler that outlives its request, or a tunnel nobody ended.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testKey = "sk-test-0123456789"

// testAuth accepts testKey only.
func testAuth(t testing.TB) *auth.Authenticator {
	t.Helper()
	return keysAuth(t, []edgeconfig.Principal{{Name: "tester", Routes: []string{edgeconfig.AllRoutes}}},
		[]edgeconfig.APIKey{{Principal: "tester", SHA256: auth.HashKey(testKey)}})
}

// keysAuth accepts keys alone, as their principals, nobody anonymously.
func keysAuth(t testing.TB, principals []edgeconfig.Principal, keys []edgeconfig.APIKey) *auth.Authenticator {
	t.Helper()
	c := edgeconfig.Default()
	c.Principals, c.API.Keys = principals, keys
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

func newEnv(t testing.TB, f *ft.Dispatcher) *env {
	t.Helper()
	m := edgemetrics.New(nil, nil)
	return &env{runner: f, metrics: m, handler: Handler(frontend.New(f, testAuth(t), frontend.Options{Metrics: m}))}
}

// req builds an authenticated request.
func req(method, path, body string) *http.Request {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
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

const chatBody = `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`

// errorTextOf decodes an Ollama error body, failing on anything else.
func errorTextOf(t *testing.T, body string) string {
	t.Helper()
	var b map[string]any
	if err := json.Unmarshal([]byte(body), &b); err != nil || len(b) != 1 {
		t.Fatalf("not an Ollama error (%v): %q", err, body)
	}
	msg, ok := b["error"].(string)
	if !ok || msg == "" {
		t.Fatalf("not an Ollama error: %q", body)
	}
	return msg
}

// value reads a counter, gauge or histogram child.
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

// requests is metrics.Requests for route and outcome.
func (e *env) requests(t *testing.T, route, outcome string) float64 {
	return metricstest.Sum(t, e.metrics.Requests, "route", route, "outcome", outcome)
}

// cancellations is metrics.Cancellations for cause.
func (e *env) cancellations(t *testing.T, cause string) float64 {
	return value(t, e.metrics.Cancellations.WithLabelValues(cause))
}

// activeTunnels is metrics.Active for tunnels.
func (e *env) activeTunnels(t *testing.T) float64 {
	return value(t, e.metrics.Active.WithLabelValues("tunnel"))
}

// ttftCount is how many times to first token were observed for route.
func (e *env) ttftCount(t *testing.T, route string) float64 {
	return metricstest.Sum(t, e.metrics.TimeToFirstToken, "route", route)
}
