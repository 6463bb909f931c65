package anthropicapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"go.uber.org/goleak"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/edgemetrics/metricstest"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// TestMain fails the package if a test leaves a goroutine behind: a
// handler that outlives its request, a ping loop, or a run nobody ended.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testKey = "sk-ant-test-0123456789"

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
	return newEnvOver(t, f, f)
}

// newEnvOver is the API over d, a dispatcher that wraps runner (to record
// what the fake does not).
func newEnvOver(t *testing.T, d frontend.Dispatcher, runner *ft.Dispatcher) *env {
	t.Helper()
	m := edgemetrics.New(nil, nil)
	return &env{runner: runner, metrics: m, handler: Handler(frontend.New(d, testAuth(t), frontend.Options{Metrics: m}))}
}

// post serves an authenticated POST /v1/messages of body in-process.
func (e *env) post(body string) *httptest.ResponseRecorder {
	return e.postTo("/v1/messages", body, nil)
}

// postTo serves an authenticated POST of body to target (a path and its
// query) in-process, with the headers of header besides Anthropic's.
func (e *env) postTo(target, body string, header http.Header) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	r.Header.Set("x-api-key", testKey)
	r.Header.Set(VersionHeader, "2023-06-01")
	r.Header.Set("Content-Type", "application/json")
	for k, vs := range header {
		r.Header[k] = vs
	}
	w := httptest.NewRecorder()
	e.handler.ServeHTTP(w, r)
	return w
}

// sessionRecorder is the fake dispatcher, recording the session key of
// every plan a run or a count starts under (frontendtest records the
// requests, not the plans).
type sessionRecorder struct {
	*ft.Dispatcher
	mu   sync.Mutex
	keys []string
}

func (s *sessionRecorder) StartRun(ctx context.Context, plan *dispatch.Plan, req *wirepb.RunRequest, watch dispatch.Watch) (frontend.Run, error) {
	s.mu.Lock()
	s.keys = append(s.keys, plan.Session)
	s.mu.Unlock()
	return s.Dispatcher.StartRun(ctx, plan, req, watch)
}

// sessions are the session keys of the plans started, in order.
func (s *sessionRecorder) sessions() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.keys)
}

// requests is metrics.Requests for the messages route and outcome.
func (e *env) requests(t *testing.T, outcome string) float64 {
	t.Helper()
	return metricstest.Sum(t, e.metrics.Requests, "route", routeMessages, "outcome", outcome)
}

const (
	plainBody  = `{"model":"m1","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
	streamBody = `{"model":"m1","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
)

// sse is one server-sent event.
type sse struct{ name, data string }

// events splits a stream into its events, failing on anything that is not
// "event: NAME\ndata: JSON\n\n" with the data's type the event's name.
func events(t *testing.T, body string) []sse {
	t.Helper()
	if !strings.HasSuffix(body, "\n\n") {
		t.Fatalf("stream does not end with a blank line: %q", body)
	}
	var out []sse
	for _, ev := range strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		name, data, ok := strings.Cut(ev, "\ndata: ")
		name, named := strings.CutPrefix(name, "event: ")
		var typed struct{ Type string }
		if !ok || !named || strings.Contains(data, "\n") || json.Unmarshal([]byte(data), &typed) != nil || typed.Type != name {
			t.Fatalf("malformed event %q", ev)
		}
		out = append(out, sse{name, data})
	}
	return out
}

// names are the events' names.
func names(evs []sse) string {
	var n []string
	for _, e := range evs {
		n = append(n, e.name)
	}
	return strings.Join(n, " ")
}

// errorBodyOf decodes an Anthropic error body, failing on anything else.
func errorBodyOf(t *testing.T, body string) errorBody {
	t.Helper()
	var b errorBody
	if err := json.Unmarshal([]byte(body), &b); err != nil || b.Type != "error" || b.Error.Type == "" || b.Error.Message == "" {
		t.Fatalf("not an Anthropic error (%v): %s", err, body)
	}
	return b
}
