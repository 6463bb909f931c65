package openaiapi

import (
	"bytes"
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

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/gateway"
	"github.com/iop-dev/iop/internal/edge/metrics"
	"github.com/iop-dev/iop/internal/edge/metrics/metricstest"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

const testKey = "sk-test-0123456789"

// step is one scripted event of a fake run, given after delay. A run whose
// steps are used up goes silent until it is cancelled, as a Node in a long
// prefill does.
type step struct {
	ev    *wirepb.RunEvent
	delay time.Duration
}

// fakeRunner is a Runner whose runs play scripted steps.
type fakeRunner struct {
	steps       []step
	startErr    error               // StartRun fails with it
	startBlocks bool                // StartRun waits for its context, as a queue wait or prefill does
	queueFor    time.Duration       // StartRun waits this long in the queue, then refuses with queue_timeout
	profile     *edgeconfig.Profile // the profile of every request; nil: idle (or an hour), no keep-alives
	deadline    time.Duration       // the run's hard deadline; 0 for none
	idle        time.Duration       // the profile's idle timeout
	profileErr  error
	models      []gateway.Model

	mu   sync.Mutex
	reqs []*wirepb.RunRequest
	runs []*fakeRun
}

func (f *fakeRunner) StartRun(ctx context.Context, p auth.Principal, model string, req *wirepb.RunRequest, admitted func()) (Run, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	if f.queueFor > 0 {
		select {
		case <-time.After(f.queueFor):
			return nil, &sched.RefusalError{Reason: sched.ReasonQueueTimeout, Model: model, RetryAfter: time.Second}
		case <-ctx.Done():
			return nil, errors.Join(errors.New("sched: queued"), ctx.Err())
		}
	}
	if f.startBlocks {
		<-ctx.Done()
		return nil, errors.Join(errors.New("sched: queued"), ctx.Err())
	}
	if f.startErr != nil {
		return nil, f.startErr
	}
	if admitted != nil {
		admitted()
	}
	r := &fakeRun{id: "run-1", steps: append([]step(nil), f.steps...), closed: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancelCause(ctx)
	r.stop = func() {}
	if f.deadline > 0 {
		r.ctx, r.stop = context.WithTimeout(r.ctx, f.deadline)
	}
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
	idle := f.idle
	if idle == 0 {
		idle = time.Hour
	}
	return edgeconfig.Profile{Name: "default", IdleTimeout: yamlconf.Duration(idle)}, nil
}

// run returns the only run started.
func (f *fakeRunner) run(t *testing.T) *fakeRun {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.runs) != 1 {
		t.Fatalf("%d runs started, want 1", len(f.runs))
	}
	return f.runs[0]
}

// fakeRun plays its steps; Next is only called by the handler's goroutine,
// Cancel from anywhere.
type fakeRun struct {
	id     string
	steps  []step
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   context.CancelFunc
	done   bool

	mu        sync.Mutex
	cancels   []error
	closeOnce sync.Once
	closed    chan struct{}
}

func (r *fakeRun) ID() string { return r.id }

func (r *fakeRun) Next() (*wirepb.RunEvent, error) {
	if r.done {
		return nil, io.EOF
	}
	if len(r.steps) > 0 && r.ctx.Err() == nil {
		s := r.steps[0]
		r.steps = r.steps[1:]
		if s.delay > 0 {
			select {
			case <-time.After(s.delay):
			case <-r.ctx.Done():
				return r.cancelled(), nil
			}
		}
		r.done = s.ev.GetType().IsTerminal()
		return s.ev, nil
	}
	<-r.ctx.Done()
	return r.cancelled(), nil
}

// cancelled is the terminal the transport makes when the run's context
// ends.
func (r *fakeRun) cancelled() *wirepb.RunEvent {
	r.done = true
	return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED}
}

func (r *fakeRun) Close() {
	r.closeOnce.Do(func() {
		r.stop()
		r.cancel(context.Canceled)
		close(r.closed)
	})
}

func (r *fakeRun) Cancel(cause error) {
	r.mu.Lock()
	r.cancels = append(r.cancels, cause)
	r.mu.Unlock()
	r.cancel(cause)
}

func (r *fakeRun) Context() context.Context { return r.ctx }

// cancelledWith reports whether the run was cancelled with cause.
func (r *fakeRun) cancelledWith(cause error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.cancels {
		if errors.Is(c, cause) {
			return true
		}
	}
	return false
}

// Events a script is made of.
func textEv(s string) step {
	return step{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: s}}
}

func reasoningEv(s string) step {
	return step{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA, Text: s}}
}

func toolEv(index int32, id, name, args string) step {
	return step{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA,
		ToolCall: &wirepb.ToolCall{Index: index, Id: id, Name: name, ArgumentsJson: []byte(args)}}}
}

func usageEv(prompt, completion int64) step {
	return step{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_USAGE,
		Usage: &wirepb.Usage{PromptTokens: prompt, CompletionTokens: completion}}}
}

func completedEv(reason string) step {
	return step{ev: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, DoneReason: reason}}
}

func terminalEv(t wirepb.RunEventType, kind wirepb.FailureKind, msg string) step {
	ev := &wirepb.RunEvent{Type: t}
	if kind != wirepb.FailureKind_FAILURE_KIND_UNSPECIFIED || msg != "" {
		ev.Failure = &wirepb.Failure{Kind: kind, Message: msg}
	}
	return step{ev: ev}
}

func after(d time.Duration, s step) step { s.delay = d; return s }

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
