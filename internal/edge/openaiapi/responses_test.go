package openaiapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/iop-dev/iop/internal/edge/edgemetrics/metricstest"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// respReq builds an authenticated Responses request with body.
func respReq(body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/responses", strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+testKey)
	r.Header.Set("Content-Type", "application/json")
	return r
}

const (
	respStreamBody = `{"model":"m1","stream":true,"input":"hi","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}]}`
	respPlainBody  = `{"model":"m1","input":"hi"}`
)

// sseEvent is one event of a Responses stream: its name and data, or a
// keep-alive comment (name "keep-alive").
type sseEvent struct {
	name string
	data string
}

// respEvents splits a Responses stream into its events, failing on
// anything that is not "event: T\ndata: {...type T...}" or a keep-alive
// comment, and on sequence numbers that do not count up from 0.
func respEvents(t *testing.T, body string) []sseEvent {
	t.Helper()
	if !strings.HasSuffix(body, "\n\n") {
		t.Fatalf("stream does not end with a blank line: %q", body)
	}
	var out []sseEvent
	seq := int64(0)
	for _, block := range strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		if block == ": keep-alive" {
			out = append(out, sseEvent{name: "keep-alive"})
			continue
		}
		head, data, ok := strings.Cut(block, "\n")
		name, ok1 := strings.CutPrefix(head, "event: ")
		data, ok2 := strings.CutPrefix(data, "data: ")
		if !ok || !ok1 || !ok2 || strings.Contains(data, "\n") {
			t.Fatalf("malformed event %q", block)
		}
		var ev struct {
			Type           string `json:"type"`
			SequenceNumber *int64 `json:"sequence_number"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil || ev.Type != name || ev.SequenceNumber == nil {
			t.Fatalf("event %q: type %q, sequence_number %v (%v)", name, ev.Type, ev.SequenceNumber, err)
		}
		if *ev.SequenceNumber != seq {
			t.Fatalf("event %q has sequence_number %d, want %d", name, *ev.SequenceNumber, seq)
		}
		seq++
		out = append(out, sseEvent{name: name, data: data})
	}
	return out
}

func eventNames(evs []sseEvent) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.name)
	}
	return out
}

// responseOf decodes the response an event carries (or a whole one).
func responseOf(t *testing.T, data string, nested bool) responseObject {
	t.Helper()
	var r responseObject
	var err error
	if nested {
		var ev struct{ Response *responseObject }
		err = json.Unmarshal([]byte(data), &ev)
		if ev.Response != nil {
			r = *ev.Response
		}
	} else {
		err = json.Unmarshal([]byte(data), &r)
	}
	if err != nil || r.Object != "response" {
		t.Fatalf("not a response (%v): %s", err, data)
	}
	return r
}

func (e *env) respRequests(t *testing.T, outcome string) float64 {
	return metricstest.Sum(t, e.metrics.Requests, "route", routeResponses, "outcome", outcome)
}

// P2, R2: a run's events stream as the Responses API's documented events,
// in order, numbered from 0: the response's head, then each item opened,
// filled and closed (reasoning, message, function call), then
// response.completed with the whole response and its usage.
func TestResponsesStreamIsTheDocumentedEventSequence(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{
		ft.Reasoning("hmm"), ft.Text("Hel"), ft.Text("lo"),
		ft.ToolCall(0, "call_1", "get_weather", `{"city":`), ft.ToolCall(0, "", "", `"Seoul"}`),
		ft.Usage(3, 4), ft.Completed("stop"),
	}})
	w := e.do(respReq(respStreamBody))
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q: %s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	evs := respEvents(t, w.Body.String())
	want := []string{
		"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
		"response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done",
		"response.completed",
	}
	if got := eventNames(evs); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("events\n got %q\nwant %q", got, want)
	}
	for i, want := range map[int]string{
		2:  `{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"type":"reasoning","id":"rs_run-1_0","status":"in_progress","summary":[],"content":[]}}`,
		4:  `{"type":"response.reasoning_text.delta","sequence_number":4,"output_index":0,"item_id":"rs_run-1_0","content_index":0,"delta":"hmm"}`,
		9:  `{"type":"response.content_part.added","sequence_number":9,"output_index":1,"item_id":"msg_run-1_1","content_index":0,"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}}`,
		10: `{"type":"response.output_text.delta","sequence_number":10,"output_index":1,"item_id":"msg_run-1_1","content_index":0,"delta":"Hel","logprobs":[]}`,
		12: `{"type":"response.output_text.done","sequence_number":12,"output_index":1,"item_id":"msg_run-1_1","content_index":0,"text":"Hello","logprobs":[]}`,
		14: `{"type":"response.output_item.done","sequence_number":14,"output_index":1,"item":{"type":"message","id":"msg_run-1_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello","annotations":[],"logprobs":[]}]}}`,
		15: `{"type":"response.output_item.added","sequence_number":15,"output_index":2,"item":{"type":"function_call","id":"fc_run-1_2","status":"in_progress","call_id":"call_1","name":"get_weather","arguments":""}}`,
		16: `{"type":"response.function_call_arguments.delta","sequence_number":16,"output_index":2,"item_id":"fc_run-1_2","delta":"{\"city\":"}`,
		18: `{"type":"response.function_call_arguments.done","sequence_number":18,"output_index":2,"item_id":"fc_run-1_2","name":"get_weather","arguments":"{\"city\":\"Seoul\"}"}`,
	} {
		if evs[i].data != want {
			t.Errorf("event %d\n got %s\nwant %s", i, evs[i].data, want)
		}
	}
	created := responseOf(t, evs[0].data, true)
	if created.ID != "resp_run-1" || created.Status != "in_progress" || len(created.Output) != 0 || created.Usage != nil {
		t.Errorf("response.created: %s", evs[0].data)
	}
	done := responseOf(t, evs[len(evs)-1].data, true)
	if done.Status != "completed" || len(done.Output) != 3 || done.Usage == nil || done.Usage.InputTokens != 3 ||
		done.Usage.OutputTokens != 4 || done.Usage.TotalTokens != 7 || done.CompletedAt == nil {
		t.Errorf("response.completed: %s", evs[len(evs)-1].data)
	}
	if e.respRequests(t, "ok") != 1 || metricstest.Sum(t, e.metrics.Requests, "route", routeChat, "outcome", "ok") != 0 {
		t.Error("the request was not counted under openai_responses")
	}
}

// timestamps are a response's, replaced for comparison.
var timestamps = regexp.MustCompile(`"(created_at|completed_at)":\d+`)

// P2: a response that is not streamed is one Response object, as OpenAI
// sends it: every field its SDKs require, the request's settings echoed.
func TestResponsesWholeResponseIsOpenAIsObject(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{
		ft.Reasoning("hmm"), ft.Text("It is "), ft.Text("sunny."), ft.ToolCall(0, "", "get_weather", `{"city":"Seoul"}`),
		ft.Usage(5, 6), ft.Completed("tool_calls"),
	}})
	w := e.do(respReq(`{"model":"m1","instructions":"be brief","input":"weather?","max_output_tokens":99,"temperature":0.2,` +
		`"metadata":{"k":"v"},"reasoning":{"effort":"low"},"tools":[{"type":"function","name":"get_weather","description":"now",` +
		`"parameters":{"type":"object"},"strict":true}],"tool_choice":"auto"}`))
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	got := timestamps.ReplaceAllString(strings.TrimSpace(w.Body.String()), `"$1":0`)
	want := compact(t, `{"id":"resp_run-1","object":"response","created_at":0,"status":"completed","background":false,
		"completed_at":0,"error":null,"incomplete_details":null,"model":"m1","output":[
		{"type":"reasoning","id":"rs_run-1_0","status":"completed","summary":[],"content":[{"type":"reasoning_text","text":"hmm"}]},
		{"type":"message","id":"msg_run-1_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"It is sunny.","annotations":[],"logprobs":[]}]},
		{"type":"function_call","id":"fc_run-1_2","status":"completed","call_id":"call_run-1_0","name":"get_weather","arguments":"{\"city\":\"Seoul\"}"}],
		"previous_response_id":null,"store":false,"truncation":"disabled",
		"usage":{"input_tokens":5,"input_tokens_details":{"cached_tokens":0},"output_tokens":6,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":11},
		"user":null,"instructions":"be brief","max_output_tokens":99,"metadata":{"k":"v"},"parallel_tool_calls":true,
		"reasoning":{"effort":"low","summary":null},"temperature":0.2,"text":{"format":{"type":"text"}},"tool_choice":"auto",
		"tools":[{"type":"function","name":"get_weather","description":"now","parameters":{"type":"object"},"strict":true}],"top_p":null}`)
	if got != want {
		t.Errorf("response\n got %s\nwant %s", got, want)
	}
	if e.respRequests(t, "ok") != 1 {
		t.Error("the request was not counted ok")
	}
}

// P2: a run that stops at its length limit is an incomplete response with
// incomplete_details.reason max_output_tokens, streamed (response.incomplete,
// its open item incomplete) or not.
func TestResponsesStoppedAtTheLengthLimitIsIncomplete(t *testing.T) {
	script := []ft.Step{ft.Text("partial"), ft.Usage(2, 16), ft.Completed("length")}
	e := newEnv(t, &ft.Dispatcher{Events: script})
	evs := respEvents(t, e.do(respReq(respStreamBody)).Body.String())
	last := evs[len(evs)-1]
	r := responseOf(t, last.data, true)
	if last.name != "response.incomplete" || r.Status != "incomplete" || r.IncompleteDetails == nil ||
		r.IncompleteDetails.Reason != "max_output_tokens" || r.CompletedAt != nil {
		t.Errorf("last event %s: %s", last.name, last.data)
	}
	if item := evs[len(evs)-2]; item.name != "response.output_item.done" || !strings.Contains(item.data, `"status":"incomplete"`) {
		t.Errorf("the open item was not closed incomplete: %s %s", item.name, item.data)
	}
	e = newEnv(t, &ft.Dispatcher{Events: script})
	w := e.do(respReq(respPlainBody))
	r = responseOf(t, w.Body.String(), false)
	if w.Code != http.StatusOK || r.Status != "incomplete" || r.IncompleteDetails.Reason != "max_output_tokens" {
		t.Errorf("whole: %d %s", w.Code, w.Body)
	}
}

// A run that says nothing still answers with one (empty) message, so that
// output is never empty.
func TestResponsesEmptyAnswerIsOneEmptyMessage(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Completed("stop")}})
	r := responseOf(t, e.do(respReq(respPlainBody)).Body.String(), false)
	if len(r.Output) != 1 || !strings.Contains(mustJSON(t, r.Output[0]), `"text":""`) {
		t.Errorf("output %v", r.Output)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// P1, P2: what fails before the response started is an HTTP error in
// OpenAI's shape, streamed or not: an unknown model is 404
// model_not_found, a refusal 429 or 503 with its reason, a failure of the
// run before its first output the failure's status.
func TestResponsesErrorsBeforeOutputAreHTTPErrors(t *testing.T) {
	tests := []struct {
		name   string
		runner *ft.Dispatcher
		status int
		code   string
	}{
		{"unknown model", &ft.Dispatcher{ResolveErr: dispatch.ErrUnknownModel}, http.StatusNotFound, "model_not_found"},
		{"queue full", &ft.Dispatcher{StartErr: &sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "m1", RetryAfter: time.Second}},
			http.StatusTooManyRequests, "queue_full"},
		{"no candidate", &ft.Dispatcher{StartErr: &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: "m1"}},
			http.StatusServiceUnavailable, "no_candidate"},
		{"failed before output", &ft.Dispatcher{Events: []ft.Step{ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
			wirepb.FailureKind_FAILURE_KIND_UPSTREAM, "boom")}}, http.StatusBadGateway, "upstream"},
	}
	for _, tt := range tests {
		for _, body := range []string{respStreamBody, respPlainBody} {
			t.Run(tt.name, func(t *testing.T) {
				e := newEnv(t, tt.runner)
				w := e.do(respReq(body))
				b := apiErrorOf(t, w.Body.String())
				if w.Code != tt.status || codeOf(b) != tt.code || w.Header().Get("Content-Type") != "application/json" {
					t.Errorf("status %d code %q: %s", w.Code, codeOf(b), w.Body)
				}
				if e.respRequests(t, tt.code) != 1 {
					t.Errorf("not counted as %s", tt.code)
				}
			})
		}
	}
}

// P2: a failure after the response started is an error event (OpenAI's
// documented fields, and the same in an "error" object, which the SDKs
// raise) and response.failed, whose response carries the error and the
// output so far: never a silent end.
func TestResponsesFailureAfterOutputIsAnErrorEventAndResponseFailed(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("Hel"), ft.Usage(2, 1),
		ft.Ended(wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, wirepb.FailureKind_FAILURE_KIND_UPSTREAM, "model crashed")}})
	w := e.do(respReq(respStreamBody))
	evs := respEvents(t, w.Body.String())
	got := eventNames(evs)
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "error", "response.failed"}
	if w.Code != http.StatusOK || strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("status %d, events %q", w.Code, got)
	}
	var ev struct {
		Code, Message string
		Param         *string
		Error         struct{ Code, Message, Type string }
	}
	if err := json.Unmarshal([]byte(evs[5].data), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Code != "upstream" || !strings.Contains(ev.Message, "model crashed") || ev.Param != nil ||
		ev.Error.Code != ev.Code || ev.Error.Message != ev.Message || ev.Error.Type != typeServer {
		t.Errorf("error event %s", evs[5].data)
	}
	r := responseOf(t, evs[6].data, true)
	if r.Status != "failed" || r.Error == nil || r.Error.Code != "upstream" || len(r.Output) != 1 ||
		!strings.Contains(mustJSON(t, r.Output[0]), `"status":"incomplete"`) || r.Usage == nil || r.Usage.InputTokens != 2 {
		t.Errorf("response.failed %s", evs[6].data)
	}
	if e.respRequests(t, "upstream") != 1 {
		t.Error("the failure was not counted")
	}
}

// SPEC S5: the idle timeout after output started ends the stream the same
// way, with its own code.
func TestResponsesIdleTimeoutAfterOutputIsInStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &ft.Dispatcher{Idle: 30 * time.Second, Events: []ft.Step{ft.Text("a")}}
		e := newEnv(t, f)
		evs := respEvents(t, e.do(respReq(respStreamBody)).Body.String())
		last := evs[len(evs)-1]
		if last.name != "response.failed" || !strings.Contains(last.data, `"code":"idle_timeout"`) || evs[len(evs)-2].name != "error" {
			t.Errorf("events %q, last %s", eventNames(evs), last.data)
		}
		if !f.Run(t).CancelledWith(frontend.ErrIdleTimeout) {
			t.Error("the run was not cancelled with frontend.ErrIdleTimeout")
		}
	})
}

// Issue 11, P2: a streamed response waiting in a silent prefill gets its
// headers and an SSE comment every keepalive_interval, then its events;
// a refusal after a keep-alive committed the stream is in-stream, after
// the response's head.
func TestResponsesKeepAlivesWhileQueuedOrInPrefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &ft.Dispatcher{Profile: profileWith(15 * time.Second),
			Events: []ft.Step{ft.After(130*time.Second, ft.Text("late")), ft.Completed("stop")}}
		e := newEnv(t, f)
		evs := respEvents(t, e.do(respReq(respStreamBody)).Body.String())
		alive := 0
		for alive < len(evs) && evs[alive].name == "keep-alive" {
			alive++
		}
		rest := eventNames(evs[alive:])
		if alive != 8 || rest[0] != "response.created" || rest[len(rest)-1] != "response.completed" {
			t.Errorf("%d keep-alives, then %q", alive, rest)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		f := &ft.Dispatcher{Profile: profileWith(10 * time.Second), QueueFor: 30 * time.Second}
		e := newEnv(t, f)
		w := e.do(respReq(respStreamBody))
		evs := respEvents(t, w.Body.String())
		got := strings.Join(eventNames(evs), " ")
		if w.Code != http.StatusOK || !strings.HasPrefix(got, "keep-alive") ||
			!strings.HasSuffix(got, "response.created response.in_progress error response.failed") ||
			!strings.Contains(evs[len(evs)-1].data, `"code":"queue_timeout"`) {
			t.Errorf("status %d, events %q", w.Code, got)
		}
		if r := responseOf(t, evs[len(evs)-1].data, true); !strings.HasPrefix(r.ID, "resp_") || len(r.ID) < 10 {
			t.Errorf("a response without a run has id %q", r.ID)
		}
	})
}

// A known path with another method is 405 in OpenAI's shape.
func TestResponsesOtherMethodsAreNotAllowed(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{})
	r := httptest.NewRequest(http.MethodGet, "/v1/responses", nil)
	r.Header.Set("Authorization", "Bearer "+testKey)
	w := e.do(r)
	if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != http.MethodPost {
		t.Errorf("status %d allow %q", w.Code, w.Header().Get("Allow"))
	}
	if w := e.do(httptest.NewRequest(http.MethodPost, "/v1/responses", strings.NewReader(respPlainBody))); w.Code != http.StatusUnauthorized {
		t.Errorf("without a key: status %d", w.Code)
	}
}
