package ollamaapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/gateway"
	"github.com/iop-dev/iop/internal/edge/metrics"
	"github.com/iop-dev/iop/internal/edge/metrics/metricstest"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// TestMain fails the package if a test leaves a goroutine behind: a
// handler that outlives its request, or a tunnel nobody ended.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testKey = "sk-test-0123456789"

// piece is one scripted body read of a fake tunnel, given after delay, or
// once gate is closed.
type piece struct {
	data  string
	delay time.Duration
	gate  chan struct{}
}

// fakeRunner is a Runner whose tunnels play a scripted head and body, then
// end with end (nil: completed). With silent set, a tunnel whose pieces
// are used up says nothing until it is cancelled, as a provider in a long
// prefill does.
type fakeRunner struct {
	head        *wirepb.TunnelResponseHead // nil: 200 application/x-ndjson
	pieces      []piece
	end         error // how the body ends: nil for io.EOF (completed)
	silent      bool
	startErr    error
	startBlocks bool          // StartTunnel waits for its context, as a queue wait does
	queueFor    time.Duration // StartTunnel waits this long in the queue, then refuses with queue_timeout
	deadline    time.Duration // the tunnel's hard deadline; 0 for none
	idle        time.Duration // the profile's idle timeout
	forbidden   []string      // models the principal may not use
	targets     []string      // the candidates' targets StartTunnel tries, in order; nil: the model's name
	replies     map[string][]gateway.MetadataReply
	// inventory is what can be served now; nil: every model asked for is
	// served by an Ollama server (so chat and generate are tunnelled).
	inventory []gateway.Offering
	// events are the events of every run StartRun starts (a model no
	// Ollama server serves), each after its delay.
	events []runStep
	// unknown are models no route names and no Node offers.
	unknown []string

	mu      sync.Mutex
	starts  []started
	tunnels []*fakeTunnel
	meta    []string // "METHOD path maxBody" of each Metadata call
	runReqs []*wirepb.RunRequest
}

// runStep is one event of a fake run, given after delay.
type runStep struct {
	ev    *wirepb.RunEvent
	delay time.Duration
}

func (f *fakeRunner) Inventory(p auth.Principal) []gateway.Offering { return f.inventory }

func (f *fakeRunner) Offered(p auth.Principal, model string) (gateway.Offering, bool) {
	if f.inventory == nil {
		return gateway.Offering{ID: model, Candidates: []sched.Candidate{{NodeID: "n1", Provider: "ollama", Adapter: "ollama", Target: model}}}, true
	}
	for _, o := range f.inventory {
		if o.ID == model {
			return o, true
		}
	}
	return gateway.Offering{}, false
}

func (f *fakeRunner) Available(p auth.Principal, model string) error {
	if _, err := f.Profile(p, model); err != nil {
		return err
	}
	if slices.Contains(f.unknown, model) {
		return fmt.Errorf("%w: %q", gateway.ErrUnknownModel, model)
	}
	if _, ok := f.Offered(p, model); !ok {
		return &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: model}
	}
	return nil
}

func (f *fakeRunner) StartRun(ctx context.Context, p auth.Principal, model string, req *wirepb.RunRequest, admitted func()) (Run, error) {
	f.mu.Lock()
	f.runReqs = append(f.runReqs, req)
	f.mu.Unlock()
	if slices.Contains(f.unknown, model) {
		return nil, fmt.Errorf("%w: %q", gateway.ErrUnknownModel, model)
	}
	if f.startErr != nil {
		return nil, f.startErr
	}
	if admitted != nil {
		admitted()
	}
	r := &fakeRun{steps: append([]runStep(nil), f.events...)}
	r.ctx, r.cancel = context.WithCancelCause(ctx)
	return r, nil
}

// fakeRun plays its steps, then waits to be cancelled.
type fakeRun struct {
	steps  []runStep
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   bool
}

func (r *fakeRun) ID() string { return "run-1" }

func (r *fakeRun) Next() (*wirepb.RunEvent, error) {
	if r.done {
		return nil, io.EOF
	}
	if len(r.steps) > 0 && r.ctx.Err() == nil {
		s := r.steps[0]
		r.steps = r.steps[1:]
		select {
		case <-time.After(s.delay):
		case <-r.ctx.Done():
			r.done = true
			return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED}, nil
		}
		r.done = gateway.IsTerminal(s.ev)
		return s.ev, nil
	}
	<-r.ctx.Done()
	r.done = true
	return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED}, nil
}

func (r *fakeRun) Close()                   { r.cancel(context.Canceled) }
func (r *fakeRun) Cancel(cause error)       { r.cancel(cause) }
func (r *fakeRun) Context() context.Context { return r.ctx }

// offering is a model served by candidates of the given adapters.
func offering(id string, adapters ...string) gateway.Offering {
	o := gateway.Offering{ID: id}
	for i, a := range adapters {
		o.Candidates = append(o.Candidates, sched.Candidate{NodeID: fmt.Sprintf("n%d", i+1), Provider: a, Adapter: a, Target: id})
	}
	return o
}

// started is one StartTunnel call.
type started struct {
	model  string
	req    *wirepb.TunnelRequest
	body   []byte   // the body of the candidate tried last
	bodies []string // the body made for each target tried, in order
}

func (f *fakeRunner) StartTunnel(ctx context.Context, p auth.Principal, model string, req *wirepb.TunnelRequest, body gateway.TunnelBody, admitted func()) (Tunnel, error) {
	targets := f.targets
	if targets == nil {
		targets = []string{model}
	}
	s := started{model: model, req: req}
	for _, target := range targets { // as the gateway does, one call per candidate tried
		b, err := body(target)
		if err != nil {
			return nil, err
		}
		s.body = b
		s.bodies = append(s.bodies, string(b))
	}
	f.mu.Lock()
	f.starts = append(f.starts, s)
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
	head := f.head
	if head == nil {
		head = &wirepb.TunnelResponseHead{Status: 200, Headers: []*wirepb.Header{{Name: "Content-Type", Value: "application/x-ndjson"}}}
	}
	t := &fakeTunnel{id: "tun-1", head: head, pieces: append([]piece(nil), f.pieces...), end: f.end, silent: f.silent,
		closed: make(chan struct{})}
	t.ctx, t.cancel = context.WithCancelCause(ctx)
	t.stop = func() {}
	if f.deadline > 0 {
		t.ctx, t.stop = context.WithTimeout(t.ctx, f.deadline)
	}
	f.mu.Lock()
	f.tunnels = append(f.tunnels, t)
	f.mu.Unlock()
	return t, nil
}

func (f *fakeRunner) Profile(p auth.Principal, model string) (edgeconfig.Profile, error) {
	for _, m := range f.forbidden {
		if m == model {
			return edgeconfig.Profile{}, fmt.Errorf("%w: principal %q may not use %q", gateway.ErrForbidden, p.Name, model)
		}
	}
	idle := f.idle
	if idle == 0 {
		idle = time.Hour
	}
	return edgeconfig.Profile{Name: "default", IdleTimeout: yamlconf.Duration(idle)}, nil
}

func (f *fakeRunner) Metadata(ctx context.Context, method, path string, maxBody int64) []gateway.MetadataReply {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.meta = append(f.meta, fmt.Sprintf("%s %s %d", method, path, maxBody))
	return append([]gateway.MetadataReply(nil), f.replies[path]...)
}

// tunnel returns the only tunnel started.
func (f *fakeRunner) tunnel(t *testing.T) *fakeTunnel {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.tunnels) != 1 {
		t.Fatalf("%d tunnels started, want 1", len(f.tunnels))
	}
	return f.tunnels[0]
}

// start returns the only StartTunnel call.
func (f *fakeRunner) start(t *testing.T) started {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.starts) != 1 {
		t.Fatalf("%d StartTunnel calls, want 1", len(f.starts))
	}
	return f.starts[0]
}

// fakeTunnel plays its pieces; Read is only called by the handler's
// goroutine, Cancel from anywhere.
type fakeTunnel struct {
	id     string
	head   *wirepb.TunnelResponseHead
	pieces []piece
	end    error
	silent bool
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   context.CancelFunc
	buf    []byte
	err    error // once the body has ended

	mu        sync.Mutex
	cancels   []error
	usage     [][2]int64 // CountUsage calls: prompt, completion
	closeOnce sync.Once
	closed    chan struct{}
}

func (t *fakeTunnel) ID() string                       { return t.id }
func (t *fakeTunnel) Head() *wirepb.TunnelResponseHead { return t.head }
func (t *fakeTunnel) Context() context.Context         { return t.ctx }

func (t *fakeTunnel) Ready() bool { return len(t.buf) > 0 }

func (t *fakeTunnel) Read(p []byte) (int, error) {
	for len(t.buf) == 0 {
		if t.err != nil {
			return 0, t.err
		}
		t.buf, t.err = t.next()
	}
	n := copy(p, t.buf)
	t.buf = t.buf[n:]
	return n, nil
}

// next plays the next piece, or ends the body.
func (t *fakeTunnel) next() ([]byte, error) {
	if t.ctx.Err() != nil {
		return nil, t.cancelled()
	}
	if len(t.pieces) == 0 {
		switch {
		case t.silent:
			<-t.ctx.Done()
			return nil, t.cancelled()
		case t.end != nil:
			return nil, t.end
		}
		return nil, io.EOF
	}
	pc := t.pieces[0]
	t.pieces = t.pieces[1:]
	var wait <-chan time.Time
	if pc.delay > 0 {
		wait = time.After(pc.delay)
	}
	if pc.gate != nil || wait != nil {
		select {
		case <-pc.gate:
		case <-wait:
		case <-t.ctx.Done():
			return nil, t.cancelled()
		}
	}
	return []byte(pc.data), nil
}

// cancelled is the terminal the transport makes when the tunnel's context
// ends.
func (t *fakeTunnel) cancelled() error {
	return &nodeserver.TunnelError{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED, Err: context.Cause(t.ctx)}
}

func (t *fakeTunnel) Cancel(cause error) {
	t.mu.Lock()
	t.cancels = append(t.cancels, cause)
	t.mu.Unlock()
	t.cancel(cause)
}

func (t *fakeTunnel) Close() {
	t.closeOnce.Do(func() {
		t.stop()
		t.cancel(context.Canceled)
		close(t.closed)
	})
}

func (t *fakeTunnel) CountUsage(prompt, completion int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.usage = append(t.usage, [2]int64{prompt, completion})
}

// counted returns the CountUsage calls.
func (t *fakeTunnel) counted() [][2]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.usage)
}

// cancelledWith reports whether the tunnel was cancelled with cause.
func (t *fakeTunnel) cancelledWith(cause error) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.cancels {
		if errors.Is(c, cause) {
			return true
		}
	}
	return false
}

// Pieces and ends a script is made of.
func line(s string) piece                     { return piece{data: s + "\n"} }
func after(d time.Duration, p piece) piece    { p.delay = d; return p }
func gated(gate chan struct{}, p piece) piece { p.gate = gate; return p }
func ended(o wirepb.TunnelOutcome, kind wirepb.FailureKind, msg string) error {
	te := &nodeserver.TunnelError{Outcome: o}
	if o == wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED {
		te.Stall = testStall
	}
	if kind != wirepb.FailureKind_FAILURE_KIND_UNSPECIFIED || msg != "" {
		te.Failure = &wirepb.Failure{Kind: kind, Message: msg}
	}
	return te
}

// testStall is the observation of the stalled terminals ended makes.
var testStall = &wirepb.StallObservation{StallTimeoutMs: 2000, SinceLastProgressMs: 2000, CloseConfirmed: true,
	ProviderHealth: "available", LivenessClassification: "request_stalled", HealthObservationSeq: 1, Retryable: true}

const stallText = "the provider stopped responding: no progress for 2s (stall timeout 2s); provider health available, classification request_stalled"

// testAuth accepts testKey only.
func testAuth(t testing.TB) *auth.Authenticator {
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

// errorOf decodes an Ollama error body, failing on anything else.
func errorOf(t *testing.T, body string) string {
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
