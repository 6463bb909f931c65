package frontend

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The request's life over the real dispatcher, with a tiny API of this
// test's own: the status page sees the work from its plan to the code its
// client is answered with.

// testShape answers {"error": code}.
var testShape = &API{ErrorBody: func(f *Failure) any { return map[string]string{"error": f.Code} }}

// testWriter writes a run's text as it comes.
type testWriter struct{ resp *Response }

func (w testWriter) Started(string)                 {}
func (w testWriter) Text(s string) bool             { return w.resp.Event([]byte(s)) }
func (w testWriter) Reasoning(string) bool          { return true }
func (w testWriter) ToolCall(*wirepb.ToolCall) bool { return true }
func (w testWriter) Usage(*wirepb.Usage)            {}
func (w testWriter) Complete(string) bool           { return w.resp.End(nil) }
func (w testWriter) Fail(f *Failure)                { w.resp.End([]byte("error: " + f.Code)) }

// testEndpoint is route's endpoint: a run of body {"model", "work"}, the
// work being "chat", "completion" or "embed".
func testEndpoint(route string) *Endpoint {
	type request struct{ Model, Work string }
	return &Endpoint{Route: route, Log: "test", MaxBody: 1 << 20,
		Peek: func(body []byte) (Peek, *Failure) {
			var req request
			if err := json.Unmarshal(body, &req); err != nil {
				return Peek{}, Invalid("", "%v", err)
			}
			return Peek{Model: req.Model, Stream: true}, nil
		},
		Translate: func(t *Turn) (Job, *Failure) {
			var req request
			_ = json.Unmarshal(t.Body, &req) // Peek read it
			switch req.Work {
			case "completion":
				return &RunJob{Run: &wirepb.RunRequest{Completion: &wirepb.CompletionInput{Prompt: "p"}}, Out: testWriter{t.Response()}}, nil
			case "embed":
				return &EmbedJob{Embed: &wirepb.EmbedRequest{Inputs: []string{"x"}},
					Out: func(*Response, *dispatch.Embedding) bool { return true }}, nil
			}
			return &RunJob{Run: &wirepb.RunRequest{}, Out: testWriter{t.Response()}}, nil
		}}
}

// liveFleet is a front end with a status page tracker over the real
// dispatcher and one ready Node whose provider "chat" (capacity 1) serves
// "m" and neither embeds nor completes. Key "alice" may use every route,
// key "bob" only another model's.
func liveFleet(t *testing.T) (*Front, *sched.Scheduler, *inflight.Tracker) {
	t.Helper()
	cfg, err := edgeconfig.Parse([]byte(`
listen: {http: "127.0.0.1:8080", quic: "127.0.0.1:7443"}
identity: {mode: loopback}
profiles: [{name: default, queue_timeout: 1m, max_queue_depth: 4}]
principals: [{name: alice, routes: ["*"]}, {name: bob, routes: [other]}]
routes: [{name: other, model: other}]
api:
  allow_anonymous: false
  keys: [{principal: alice, sha256: "` + auth.HashKey("alice") + `"}, {principal: bob, sha256: "` + auth.HashKey("bob") + `"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	reg := fleet.New(fleet.Options{})
	s := sched.New(reg, sched.Options{})
	d := dispatch.New(cfg, dispatch.SchedulerSlots(s), dispatch.ServerNodes(nodeserver.NewServer(nodeserver.Options{}, reg)), dispatch.Options{})
	c := reg.Register(fleet.ConnInfo{NodeID: "n1"})
	if err := reg.MarkReady(c, c.Generation(), []*wirepb.Provider{{Name: "chat", Adapter: "openai", Capacity: 1,
		State: wirepb.ProviderState_PROVIDER_STATE_ONLINE, Targets: []*wirepb.Target{{Name: "m"}}}}); err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := inflight.New(inflight.Options{})
	return New(FromDispatcher(d), a, Options{Live: tr}), s, tr
}

// post serves a POST of body with key through h.
func post(h http.Handler, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// Work that never starts is tracked from its plan to its refusal, and
// counted with the code its client is answered with: the status page's
// terminals agree with what clients saw.
func TestWorkThatNeverStartsIsCountedWithItsClientsCode(t *testing.T) {
	f, _, tr := liveFleet(t)
	h := f.Handler(testShape, testEndpoint("test_route"))
	for _, c := range []struct {
		key, body string
		status    int
	}{
		{"alice", `{"model":"m","work":"completion"}`, 400},
		{"alice", `{"model":"m","work":"embed"}`, 400},
		{"alice", `{"model":"ghost"}`, 404},
		{"bob", `{"model":"m"}`, 404}, // refused before it is work: bob may not use the model
	} {
		if w := post(h, c.key, c.body); w.Code != c.status {
			t.Errorf("%s %s: %d %s, want %d", c.key, c.body, w.Code, w.Body, c.status)
		}
	}
	s := tr.Snapshot()
	if len(s.Live) != 0 {
		t.Errorf("live = %+v, want nothing", s.Live)
	}
	if got := s.Terminals.Totals; got["unsupported"] != 2 || got["model_not_found"] != 1 || len(got) != 2 {
		t.Errorf("terminals = %v, want 2 unsupported and 1 model_not_found (the forbidden one was never work)", got)
	}
	if len(s.Recent) != 3 {
		t.Fatalf("recent = %+v, want 3", s.Recent)
	}
	run, embed := s.Recent[2], s.Recent[1]
	if run.Kind != inflight.Run || run.API != "test_route" || run.StartedAt.IsZero() || run.Principal != "alice" || run.Model != "m" ||
		!strings.HasPrefix(run.ID, "run-") {
		t.Errorf("the completion = %+v, want a run of test_route from alice, with its id", run)
	}
	if embed.Kind != inflight.Embed || !strings.HasPrefix(embed.ID, "emb-") {
		t.Errorf("the embedding call = %+v, want an embed", embed)
	}
}

// A request that waits for a slot shows as queued, and one whose client
// leaves while it waits ends "cancelled", as it is recorded.
func TestQueuedWorkShowsAsQueuedAndEndsWithItsCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, s, tr := liveFleet(t)
		go s.Run(t.Context())
		held, err := s.Acquire(t.Context(), sched.Request{ID: "holder", Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release()

		h := f.Handler(testShape, testEndpoint("test_route"))
		ctx, leave := context.WithCancel(t.Context())
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", strings.NewReader(`{"model":"m"}`))
		r.Header.Set("Authorization", "Bearer alice")
		done := make(chan struct{})
		go func() { defer close(done); h.ServeHTTP(httptest.NewRecorder(), r) }()
		synctest.Wait()
		sn := tr.Snapshot()
		if len(sn.Live) != 1 || sn.Live[0].Phase != inflight.Queued || sn.Live[0].Kind != inflight.Run || sn.Live[0].API != "test_route" || sn.Live[0].Node != "" {
			t.Fatalf("live = %+v, want one queued test_route run, on no Node yet", sn.Live)
		}

		leave()
		<-done
		sn = tr.Snapshot()
		if len(sn.Live) != 0 || len(sn.Recent) != 1 || sn.Recent[0].Reason != "cancelled" {
			t.Errorf("after the client left: live %+v recent %+v, want it ended cancelled", sn.Live, sn.Recent)
		}
	})
}
