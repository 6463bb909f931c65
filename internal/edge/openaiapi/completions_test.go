package openaiapi

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/iop-dev/iop/internal/edge/edgemetrics/metricstest"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// completionReq builds an authenticated text completion request with body.
func completionReq(body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+testKey)
	return r
}

// P2, issue 12: a text completion is a raw completion run (prompt and
// suffix, chat's sampling options, the rest passed through), answered as
// one text_completion with its finish reason and usage.
func TestACompletionRunsAsARawCompletion(t *testing.T) {
	f := &ft.Dispatcher{Events: []ft.Step{ft.Text("def "), ft.Reasoning("hidden"), ft.Text("f(x):"), ft.Usage(4, 2), ft.Completed("length")}}
	e := newEnv(t, f)
	w := e.do(completionReq(`{"model":"m1","prompt":["def"],"suffix":"return x","max_tokens":8,"temperature":0.2,"stop":"\n","best_of":2,"user":"u1"}`))
	const want = `{"id":"cmpl-run-1","object":"text_completion","created":%d,"model":"m1","choices":[{"text":"def f(x):","index":0,"logprobs":null,"finish_reason":"length"}],` +
		`"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`
	if got := compact(t, w.Body.String()); w.Code != http.StatusOK || got != fmt.Sprintf(want, createdOf(t, got)) {
		t.Fatalf("%d\n got %s\nwant %s", w.Code, got, want)
	}
	req := f.RunRequests()[0]
	if c := req.GetCompletion(); c.GetPrompt() != "def" || c.GetSuffix() != "return x" || len(req.GetMessages()) != 0 {
		t.Errorf("completion %v, messages %v", c, req.GetMessages())
	}
	o := req.GetOptions()
	if o.GetMaxTokens() != 8 || o.GetTemperature() != 0.2 || len(o.GetStop()) != 1 || string(o.GetExtraJson()) != `{"best_of":2,"user":"u1"}` {
		t.Errorf("options %v", o)
	}
	if got := metricstest.Sum(t, e.metrics.Requests, "route", routeCompletions, "outcome", "ok"); got != 1 {
		t.Errorf("requests{openai_completions,ok} = %v", got)
	}
}

// Streamed, a completion is chunks of text_completion objects, the finish
// reason on the last choice, the usage chunk when asked for, then [DONE].
func TestAStreamedCompletionEndsWithDone(t *testing.T) {
	f := &ft.Dispatcher{Events: []ft.Step{ft.Text("Hello"), ft.Text(" world"), ft.Usage(1, 2), ft.Completed("stop")}}
	w := newEnv(t, f).do(completionReq(`{"model":"m1","prompt":"Say","stream":true,"stream_options":{"include_usage":true}}`))
	evs := events(t, w.Body.String())
	if len(evs) != 5 || evs[4] != "[DONE]" || w.Header().Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events %q", evs)
	}
	for i, want := range []string{`"text":"Hello"`, `"text":" world"`, `"finish_reason":"stop"`, `"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}`} {
		if !strings.Contains(evs[i], want) || !strings.Contains(evs[i], `"object":"text_completion"`) {
			t.Errorf("event %d %s; want %s", i, evs[i], want)
		}
	}
	if !strings.Contains(evs[0], `"usage":null`) {
		t.Errorf("a chunk before the last without usage null: %s", evs[0])
	}
}

// An error after output started is an error event, then [DONE]: never a
// silent end; before it, an HTTP error. A provider without fill-in-the-
// middle is a 400.
func TestCompletionErrorsBeforeAndAfterOutput(t *testing.T) {
	f := &ft.Dispatcher{Events: []ft.Step{ft.Text("par"), ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, wirepb.FailureKind_FAILURE_KIND_UPSTREAM, "the model crashed")}}
	w := newEnv(t, f).do(completionReq(`{"model":"m1","prompt":"p","stream":true}`))
	evs := events(t, w.Body.String())
	if len(evs) != 3 || evs[2] != "[DONE]" || codeOf(apiErrorOf(t, evs[1])) != "upstream" {
		t.Errorf("events %q", evs)
	}
	f = &ft.Dispatcher{Events: []ft.Step{ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED, "no fill-in-the-middle")}}
	w = newEnv(t, f).do(completionReq(`{"model":"m1","prompt":"p","suffix":"s"}`))
	if b := apiErrorOf(t, w.Body.String()); w.Code != http.StatusBadRequest || codeOf(b) != "unsupported" || !strings.Contains(b.Error.Message, "fill-in-the-middle") {
		t.Errorf("unsupported: %d %s", w.Code, w.Body)
	}
}

// What the Edge cannot carry is refused with a 400 naming the param.
func TestCompletionRequestsThatCannotRun(t *testing.T) {
	for _, c := range []struct{ body, param string }{
		{`{"model":"m1"}`, "prompt"},
		{`{"model":"m1","prompt":[]}`, "prompt"},
		{`{"model":"m1","prompt":["a","b"]}`, "prompt"},
		{`{"model":"m1","prompt":[1,2,3]}`, "prompt"},
		{`{"model":"m1","prompt":[[1,2]]}`, "prompt"},
		{`{"model":"m1","prompt":"p","n":2}`, "n"},
		{`{"model":"m1","prompt":"p","echo":true}`, "echo"},
		{`{"model":"m1","prompt":"p","temperature":3}`, "temperature"},
		{`{"model":"m1","prompt":"p","max_tokens":0}`, "max_tokens"},
		{`{"prompt":"p"}`, "model"},
	} {
		f := &ft.Dispatcher{}
		w := newEnv(t, f).do(completionReq(c.body))
		if w.Code != http.StatusBadRequest || paramOf(apiErrorOf(t, w.Body.String())) != c.param || len(f.RunRequests()) != 0 {
			t.Errorf("%s: %d %s; want 400 naming %s", c.body, w.Code, w.Body, c.param)
		}
	}
}
