package anthropicapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/gateway"
	"github.com/iop-dev/iop/internal/edge/metrics"
	"github.com/iop-dev/iop/internal/edge/metrics/metricstest"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// TestMain fails the package if a test leaves a goroutine behind: a
// handler that outlives its request, a ping loop, or a run nobody ended.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testKey = "sk-ant-test-0123456789"

// scripted is one event of a fake run, given after its delay. A run whose
// script is used up goes silent until it is cancelled, as a Node in a long
// prefill does.
type scripted struct {
	ev    *wirepb.RunEvent
	delay time.Duration
}

// fakeRunner is a Runner whose runs play a script.
type fakeRunner struct {
	script     []scripted
	startErr   error               // StartRun fails with it
	queueFor   time.Duration       // StartRun waits this long, then fails with startErr (or runs, without one)
	profile    *edgeconfig.Profile // nil: idle timeout of an hour, no pings
	profileErr error
	models     []gateway.Model

	mu   sync.Mutex
	reqs []*wirepb.RunRequest
	runs []*fakeRun
}

func (f *fakeRunner) StartRun(ctx context.Context, p auth.Principal, model string, req *wirepb.RunRequest, admitted func()) (Run, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	select {
	case <-time.After(f.queueFor):
	case <-ctx.Done():
		return nil, errors.Join(errors.New("queued"), ctx.Err())
	}
	if f.startErr != nil {
		return nil, f.startErr
	}
	admitted()
	r := &fakeRun{script: f.script}
	r.ctx, r.cancel = context.WithCancelCause(ctx)
	f.mu.Lock()
	f.runs = append(f.runs, r)
	f.mu.Unlock()
	return r, nil
}

func (f *fakeRunner) Models(p auth.Principal) []gateway.Model { return f.models }

func (f *fakeRunner) Profile(p auth.Principal, model string) (edgeconfig.Profile, error) {
	if f.profileErr != nil {
		return edgeconfig.Profile{}, f.profileErr
	}
	if f.profile != nil {
		return *f.profile, nil
	}
	return edgeconfig.Profile{Name: "default", IdleTimeout: yamlconf.Duration(time.Hour)}, nil
}

// request returns the only run request started.
func (f *fakeRunner) request(t *testing.T) *wirepb.RunRequest {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) != 1 {
		t.Fatalf("%d runs started, want 1", len(f.reqs))
	}
	return f.reqs[0]
}

// fakeRun plays its script; Next is only called by the handler's
// goroutine, Cancel from anywhere.
type fakeRun struct {
	script []scripted
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   bool
}

func (r *fakeRun) ID() string { return "run-1" }

func (r *fakeRun) Next() (*wirepb.RunEvent, error) {
	if r.done {
		return nil, io.EOF
	}
	if len(r.script) == 0 || r.ctx.Err() != nil {
		<-r.ctx.Done()
		r.done = true
		return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED}, nil
	}
	s := r.script[0]
	r.script = r.script[1:]
	select {
	case <-time.After(s.delay):
	case <-r.ctx.Done():
		r.done = true
		return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED}, nil
	}
	r.done = gateway.IsTerminal(s.ev)
	return s.ev, nil
}

func (r *fakeRun) Close()                   { r.cancel(context.Canceled) }
func (r *fakeRun) Cancel(cause error)       { r.cancel(cause) }
func (r *fakeRun) Context() context.Context { return r.ctx }

// Events a script is made of.
func text(s string) scripted {
	return scripted{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: s}}
}

func thought(s string) scripted {
	return scripted{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA, Text: s}}
}

func call(index int32, id, name, args string) scripted {
	return scripted{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA,
		ToolCall: &wirepb.ToolCall{Index: index, Id: id, Name: name, ArgumentsJson: []byte(args)}}}
}

func used(prompt, completion int64) scripted {
	return scripted{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_USAGE,
		Usage: &wirepb.Usage{PromptTokens: prompt, CompletionTokens: completion}}}
}

func completed(reason string) scripted {
	return scripted{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, DoneReason: reason}}
}

func failed(kind wirepb.FailureKind, msg string) scripted {
	return scripted{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
		Failure: &wirepb.Failure{Kind: kind, Message: msg}}}
}

func later(d time.Duration, s scripted) scripted { s.delay = d; return s }

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

// env is a handler over a fake runner, with its metrics.
type env struct {
	runner  *fakeRunner
	metrics *metrics.Metrics
	handler http.Handler
}

func newEnv(t *testing.T, f *fakeRunner) *env {
	t.Helper()
	m := metrics.New(nil, nil)
	return &env{runner: f, metrics: m, handler: Handler(f, testAuth(t), m, nil, nil)}
}

// post serves an authenticated POST /v1/messages of body in-process.
func (e *env) post(body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(body))
	r.Header.Set("x-api-key", testKey)
	r.Header.Set(VersionHeader, "2023-06-01")
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	e.handler.ServeHTTP(w, r)
	return w
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

// errorOf decodes an Anthropic error body, failing on anything else.
func errorOf(t *testing.T, body string) errorBody {
	t.Helper()
	var b errorBody
	if err := json.Unmarshal([]byte(body), &b); err != nil || b.Type != "error" || b.Error.Type == "" || b.Error.Message == "" {
		t.Fatalf("not an Anthropic error (%v): %s", err, body)
	}
	return b
}
