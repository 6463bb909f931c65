package pluginhost_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// The round trip across the plugin boundary pins the host's conversions
// (convert.go here) to the plugin side's (sdk/convert.go): what the host
// sends as sdk values is what the adapter is handed, and what the adapter
// returns is what the host reads back, through the real gRPC path. Every
// value below sets every field (allSet checks it), so a field added to an
// sdk type without its conversions fails here.

// mirror is the adapter half of the round trip: it records what it is
// handed and answers with what the test put in it.
type mirror struct {
	mu         sync.Mutex
	req        *sdk.Request
	embedReq   *sdk.EmbedRequest
	tunnelReq  *sdk.TunnelRequest
	tunnelBody []byte

	events      []sdk.Event
	result      *sdk.Result
	err         error
	embedResult *sdk.EmbedResult
	health      sdk.Health
	status      int
	header      http.Header
	body        []byte
}

func (m *mirror) Info() sdk.Info {
	return sdk.Info{Name: "mirror", Version: "1.2.3", Description: "answers what it is told", ConfigFields: map[string]string{"k": "v"}}
}

func (m *mirror) Configure(context.Context, sdk.Config) error { return nil }

func (m *mirror) Execute(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	m.mu.Lock()
	m.req = req
	events, res, err := m.events, m.result, m.err
	m.mu.Unlock()
	for _, ev := range events {
		if err := out.Send(ctx, ev); err != nil {
			return nil, err
		}
	}
	return res, err
}

func (m *mirror) Complete(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	return m.Execute(ctx, req, out)
}

func (m *mirror) Embed(_ context.Context, req *sdk.EmbedRequest) (*sdk.EmbedResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.embedReq = req
	return m.embedResult, m.err
}

func (m *mirror) Tunnel(_ context.Context, req *sdk.TunnelRequest, resp sdk.TunnelResponse) error {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.tunnelReq, m.tunnelBody = req, body
	status, header, out, fail := m.status, m.header, m.body, m.err
	m.mu.Unlock()
	if err := resp.WriteHeader(status, header); err != nil {
		return err
	}
	if _, err := resp.Write(out); err != nil {
		return err
	}
	return fail
}

func (m *mirror) Probe(context.Context, string) (sdk.Health, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.health, m.err
}

func (m *mirror) ListTargets(context.Context) ([]sdk.Target, error) {
	return []sdk.Target{{Name: "a"}, {Name: "b"}}, nil
}

// set sets the mirror's answers under its lock.
func (m *mirror) set(f func(m *mirror)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(m)
}

func startMirror(t *testing.T) (*mirror, *pluginhost.Plugin) {
	t.Helper()
	m := &mirror{}
	p, err := pluginhost.StartInProcess(t.Context(), m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return m, p
}

// allSet fails t when a field of the struct v points to (or is) is zero:
// a round trip of it would not show that field lost.
func allSet(t *testing.T, what string, v any, except ...string) {
	t.Helper()
	rv := reflect.Indirect(reflect.ValueOf(v))
	for i := range rv.NumField() {
		name := rv.Type().Field(i).Name
		if rv.Field(i).IsZero() && !strings.Contains(" "+strings.Join(except, " ")+" ", " "+name+" ") {
			t.Errorf("%s.%s is not set: set it, so that the round trip covers it", what, name)
		}
	}
}

func fullRequest() *sdk.Request {
	temp, topP, think := 0.25, 0.5, true
	var maxTokens, seed int64 = 100, 7
	return &sdk.Request{
		RunID:     "run-1",
		SessionID: "session-1",
		Target:    "model",
		Messages: []sdk.Message{{
			Role: "assistant", Content: "c", Reasoning: "why", ToolCallID: "tc", Name: "n", Images: [][]byte{{1, 2}},
			ToolCalls: []sdk.ToolCall{{Index: 1, ID: "call-1", Name: "f", Arguments: `{"x":1}`}},
		}},
		Tools: []sdk.Tool{{Name: "f", Description: "d", Parameters: []byte(`{"type":"object"}`)}},
		Options: sdk.Options{
			Temperature: &temp, TopP: &topP, MaxTokens: &maxTokens, Stop: []string{"\n\n"}, Seed: &seed,
			Format: []byte(`"json"`), Think: &think, Extra: []byte(`{"top_k":20}`), ToolChoice: sdk.ToolChoiceFunction("f"),
			ReasoningEffort: sdk.EffortHigh,
			FormatName:      "person",
			FormatStrict:    true,
		},
		Prompt:       "def f(",
		Suffix:       "return x",
		Deadline:     time.UnixMilli(1_700_000_000_123),
		StallTimeout: 1500 * time.Millisecond,
		Credential:   &sdk.Credential{Kind: "bearer", Secret: "s3cret"},
	}
}

// execute runs req through the host and reads the outcome as sdk values.
func execute(ctx context.Context, p *pluginhost.Plugin, req *sdk.Request) ([]sdk.Event, *sdk.Result, error) {
	var events []sdk.Event
	term, err := p.Execute(ctx, pluginhost.RequestToWire(req), req.Credential, func(ev *wirepb.RunEvent) error {
		e, err := pluginhost.EventFromWire(ev)
		events = append(events, e)
		return err
	})
	if err != nil {
		return events, nil, err
	}
	res, err := pluginhost.ResultOf(term)
	return events, res, err
}

func TestRequestRoundTrip(t *testing.T) {
	in := fullRequest()
	allSet(t, "Request", in)
	allSet(t, "Options", &in.Options)
	allSet(t, "Message", &in.Messages[0])
	allSet(t, "ToolCall", &in.Messages[0].ToolCalls[0])
	allSet(t, "Tool", &in.Tools[0])
	allSet(t, "Credential", in.Credential)

	m, p := startMirror(t)
	m.set(func(m *mirror) { m.result = &sdk.Result{DoneReason: "stop"} })
	if _, _, err := execute(t.Context(), p, in); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m.req, in) {
		t.Errorf("the adapter was handed\n%+v\nwant\n%+v", m.req, in)
	}

	// Zero values: no deadline, the default stall timeout (R4), no options,
	// no credential, a chat (not a raw completion).
	if _, _, err := execute(t.Context(), p, &sdk.Request{RunID: "run-2"}); err != nil {
		t.Fatal(err)
	}
	if want := (&sdk.Request{RunID: "run-2", StallTimeout: 300 * time.Second}); !reflect.DeepEqual(m.req, want) {
		t.Errorf("a bare request was handed as %+v, want %+v", m.req, want)
	}
}

func TestEventsAndResultRoundTrip(t *testing.T) {
	usage := &sdk.Usage{PromptTokens: 1, CompletionTokens: 2, TotalDuration: 3 * time.Second, LoadDuration: 4, PromptEvalDuration: 5, EvalDuration: 6}
	allSet(t, "Usage", usage)
	events := []sdk.Event{
		{Kind: sdk.TextDelta, Text: "hello"},
		{Kind: sdk.ReasoningDelta, Text: "hm"},
		{Kind: sdk.ToolCallDelta, ToolCall: &sdk.ToolCall{Index: 2, ID: "call-2", Name: "g", Arguments: `{"y":`}},
		{Kind: sdk.UsageReport, Usage: usage},
	}
	result := &sdk.Result{DoneReason: "tool_calls", Usage: usage}
	allSet(t, "Result", result)

	m, p := startMirror(t)
	m.set(func(m *mirror) { m.events, m.result = events, result })
	got, res, err := execute(t.Context(), p, &sdk.Request{RunID: "run-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, events) {
		t.Errorf("events %+v, want %+v", got, events)
	}
	if !reflect.DeepEqual(res, result) {
		t.Errorf("result %+v, want %+v", res, result)
	}
}

func TestErrorRoundTrip(t *testing.T) {
	m, p := startMirror(t)
	for k := sdk.KindInternal; k <= sdk.KindUnsupported; k++ {
		in := &sdk.Error{Kind: k, Message: "m", UpstreamStatus: 503, Retryable: true}
		allSet(t, "Error", in, "Err") // the cause stays in the adapter's process
		m.set(func(m *mirror) { m.err = in })
		_, _, err := execute(t.Context(), p, &sdk.Request{RunID: "run-1"})
		var got *sdk.Error
		if !errors.As(err, &got) || !reflect.DeepEqual(got, in) {
			t.Errorf("%v: the host read %#v, want %#v", k, err, in)
		}
	}
	// Any other error is internal, with its text.
	m.set(func(m *mirror) { m.err = errors.New("disk full") })
	_, _, err := execute(t.Context(), p, &sdk.Request{RunID: "run-1"})
	if want := (&sdk.Error{Kind: sdk.KindInternal, Message: "disk full"}); !reflect.DeepEqual(err, want) {
		t.Errorf("a plain error read as %#v, want %#v", err, want)
	}
}

func TestHealthRoundTrip(t *testing.T) {
	m, p := startMirror(t)
	for _, status := range []sdk.HealthStatus{sdk.HealthUnknown, sdk.HealthAvailable, sdk.HealthUnavailable} {
		in := sdk.Health{Status: status, Detail: "because " + status.String()}
		m.set(func(m *mirror) { m.health = in })
		got, err := p.Probe(t.Context(), "model")
		if err != nil || got != in {
			t.Errorf("probe read %+v (%v), want %+v", got, err, in)
		}
	}
}

func TestEmbedRoundTrip(t *testing.T) {
	in := &sdk.EmbedRequest{
		EmbedID: "emb-1", SessionID: "session-1", Target: "embedder", Inputs: []string{"a", "b"}, Dimensions: 2,
		Extra: []byte(`{"user":"u"}`), Deadline: time.UnixMilli(1_700_000_000_123), StallTimeout: 2 * time.Second,
		Credential: &sdk.Credential{Kind: "bearer", Secret: "s3cret"},
	}
	allSet(t, "EmbedRequest", in)
	result := &sdk.EmbedResult{Vectors: [][]float32{{1, 2}, {3, 4}}, Usage: &sdk.Usage{PromptTokens: 4}}

	m, p := startMirror(t)
	m.set(func(m *mirror) { m.embedResult = result })
	var frames []*wirepb.EmbedVectors
	term, err := p.Embed(t.Context(), pluginhost.EmbedRequestToWire(in), in.Credential, func(f *wirepb.EmbedVectors) error {
		frames = append(frames, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m.embedReq, in) {
		t.Errorf("the adapter was handed %+v, want %+v", m.embedReq, in)
	}
	got, err := pluginhost.EmbedResultOf(term, frames)
	if err != nil || !reflect.DeepEqual(got, result) {
		t.Errorf("the host read %+v (%v), want %+v", got, err, result)
	}
}

// tunnelRecorder is a TunnelResponse that keeps what it is written.
type tunnelRecorder struct {
	status int
	header http.Header
	body   []byte
}

func (r *tunnelRecorder) WriteHeader(status int, header http.Header) error {
	r.status, r.header = status, header
	return nil
}

func (r *tunnelRecorder) Write(p []byte) (int, error) {
	r.body = append(r.body, p...)
	return len(p), nil
}

func TestTunnelRoundTrip(t *testing.T) {
	in := &sdk.TunnelRequest{
		TunnelID: "tun-1", SessionID: "session-1", Target: "model", Method: "POST", Path: "/api/chat?stream=true",
		Header: http.Header{"Content-Type": {"application/json"}, "X-Many": {"1", "2"}},
		Body:   strings.NewReader(`{"model":"m"}`), Credential: &sdk.Credential{Kind: "bearer", Secret: "s3cret"},
	}
	allSet(t, "TunnelRequest", in)

	m, p := startMirror(t)
	header := http.Header{"Content-Type": {"application/x-ndjson"}, "X-Many": {"a", "b"}}
	m.set(func(m *mirror) { m.status, m.header, m.body = 201, header, []byte("answer") })
	rec := &tunnelRecorder{}
	err := p.Tunnel(t.Context(), pluginhost.TunnelRequestToWire(in), in.Credential, in.Body, func(f *wirepb.TunnelFrame) error {
		return pluginhost.WriteTunnelFrame(rec, f)
	})
	if err != nil {
		t.Fatal(err)
	}
	got := *m.tunnelReq
	got.Body, in.Body = nil, nil
	if !reflect.DeepEqual(&got, in) || string(m.tunnelBody) != `{"model":"m"}` {
		t.Errorf("the adapter was handed %+v with body %q, want %+v", &got, m.tunnelBody, in)
	}
	if rec.status != 201 || !reflect.DeepEqual(rec.header, header) || string(rec.body) != "answer" {
		t.Errorf("the host read %d %v %q", rec.status, rec.header, rec.body)
	}

	// A failure after the head is the tunnel's outcome.
	fail := &sdk.Error{Kind: sdk.KindUpstream, Message: "cut short", UpstreamStatus: 502}
	m.set(func(m *mirror) { m.err = fail })
	err = p.Tunnel(t.Context(), pluginhost.TunnelRequestToWire(in), nil, nil, func(f *wirepb.TunnelFrame) error {
		return pluginhost.WriteTunnelFrame(&tunnelRecorder{}, f)
	})
	if !reflect.DeepEqual(err, fail) {
		t.Errorf("a failed tunnel read as %#v, want %#v", err, fail)
	}
}

func TestInfoAndTargetsRoundTrip(t *testing.T) {
	m, p := startMirror(t)
	info := m.Info()
	allSet(t, "Info", &info)
	if got := p.Info(); !reflect.DeepEqual(got, info) {
		t.Errorf("info %+v, want %+v", got, info)
	}
	targets, err := p.ListTargets(t.Context())
	if want := []sdk.Target{{Name: "a"}, {Name: "b"}}; err != nil || !reflect.DeepEqual(targets, want) {
		t.Errorf("targets %+v (%v), want %+v", targets, err, want)
	}
}
