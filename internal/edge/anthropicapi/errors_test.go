package anthropicapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Before output, a failure is the HTTP status with Anthropic's error
// type for it; a scheduler refusal also says why in X-IOP-Refusal, and a
// busy one when to retry (P1: an unknown model is 404 not_found_error).
func TestErrorsBeforeOutputAreTheStatus(t *testing.T) {
	tests := []struct {
		name       string
		runner     *ft.Dispatcher
		status     int
		typ        string
		refusal    string
		retryAfter string
		outcome    string
	}{
		{"unknown model", &ft.Dispatcher{StartErr: fmt.Errorf("%w: %q", dispatch.ErrUnknownModel, "m1")},
			404, typeNotFound, "", "", "model_not_found"},
		{"a model the key may not use", &ft.Dispatcher{ResolveErr: fmt.Errorf("%w: route r", dispatch.ErrForbidden)},
			404, typeNotFound, "", "", "model_not_found"},
		{"queue full", &ft.Dispatcher{StartErr: &sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "m1", RetryAfter: 2500 * time.Millisecond}},
			429, typeRateLimit, "queue_full", "3", "queue_full"},
		{"no candidate", &ft.Dispatcher{StartErr: &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: "m1"}},
			503, typeOverloaded, "no_candidate", "", "no_candidate"},
		{"every candidate failed", &ft.Dispatcher{StartErr: &dispatch.RunFailedError{Event: &wirepb.RunEvent{
			Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_UPSTREAM, Message: "boom"}}}},
			502, typeAPI, "", "", "upstream"},
		{"deadline while queued", &ft.Dispatcher{StartErr: fmt.Errorf("queued: %w", context.DeadlineExceeded)},
			504, typeTimeout, "", "", "deadline_exceeded"},
		{"the provider rejects the request", &ft.Dispatcher{Events: []ft.Step{ft.Failed(wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST, "bad schema")}},
			400, typeInvalidRequest, "", "", "invalid_request"},
		{"stalled before output", &ft.Dispatcher{Events: []ft.Step{{Event: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED}}}},
			504, typeTimeout, "", "", "response_stalled"},
	}
	for _, tt := range tests {
		for _, body := range []string{plainBody, streamBody} {
			t.Run(fmt.Sprintf("%s stream=%v", tt.name, body == streamBody), func(t *testing.T) {
				e := newEnv(t, tt.runner)
				w := e.post(body)
				if w.Code != tt.status {
					t.Fatalf("status %d, want %d: %s", w.Code, tt.status, w.Body)
				}
				if b := errorBodyOf(t, w.Body.String()); b.Error.Type != tt.typ {
					t.Errorf("type %q, want %q: %s", b.Error.Type, tt.typ, w.Body)
				}
				if got := w.Header().Get(frontend.RefusalHeader); got != tt.refusal {
					t.Errorf("%s = %q, want %q", frontend.RefusalHeader, got, tt.refusal)
				}
				if got := w.Header().Get("Retry-After"); got != tt.retryAfter {
					t.Errorf("Retry-After = %q, want %q", got, tt.retryAfter)
				}
				if e.requests(t, tt.outcome) != 1 {
					t.Errorf("not counted as %s", tt.outcome)
				}
			})
		}
	}
}

// After output has started, a failure is an error event that ends the
// stream: never a silent end, never message_stop.
func TestAFailureAfterOutputIsAnErrorEvent(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("Hel"), ft.Failed(wirepb.FailureKind_FAILURE_KIND_UPSTREAM, "out of memory")}})
	w := e.post(streamBody)
	evs := events(t, w.Body.String())
	if w.Code != http.StatusOK || names(evs) != "message_start content_block_start content_block_delta error" {
		t.Fatalf("status %d, events %s", w.Code, names(evs))
	}
	b := errorBodyOf(t, evs[len(evs)-1].data)
	if b.Error.Type != typeAPI || !strings.Contains(b.Error.Message, "out of memory") || !strings.HasPrefix(b.Error.Message, "upstream: ") {
		t.Errorf("error %+v", b.Error)
	}
	if e.requests(t, "upstream") != 1 {
		t.Error("not counted as upstream")
	}
	// Sent whole, the same failure is the status: nothing went out before.
	w = newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("Hel"), ft.Failed(wirepb.FailureKind_FAILURE_KIND_UPSTREAM, "out of memory")}}).post(plainBody)
	if b := errorBodyOf(t, w.Body.String()); w.Code != http.StatusBadGateway || b.Error.Type != typeAPI {
		t.Errorf("whole: %d %s", w.Code, w.Body)
	}
}

// Anthropic's type for each status the Edge answers with.
func TestErrorTypeByStatus(t *testing.T) {
	for status, want := range map[int]string{
		400: typeInvalidRequest, 401: typeAuthentication, 403: typePermission, 404: typeNotFound, 405: typeInvalidRequest,
		408: typeInvalidRequest, 413: typeTooLarge, 429: typeRateLimit, 500: typeAPI, 502: typeAPI, 503: typeOverloaded,
		504: typeTimeout, 529: typeOverloaded,
	} {
		if got := errorType(status); got != want {
			t.Errorf("errorType(%d) = %q, want %q", status, got, want)
		}
	}
}

// The key is checked first, from x-api-key (Anthropic's clients) or a
// bearer token; other paths and methods get Anthropic's shape too.
func TestAuthenticationAndUnknownPaths(t *testing.T) {
	h := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Completed("stop")}}).handler
	for _, tt := range []struct {
		name, method, path string
		header             http.Header
		status             int
		typ                string
	}{
		{"no key", "POST", "/v1/messages", http.Header{}, 401, typeAuthentication},
		{"wrong key", "POST", "/v1/messages", http.Header{"X-Api-Key": {"sk-wrong"}}, 401, typeAuthentication},
		{"bearer key", "POST", "/v1/messages", http.Header{"Authorization": {"Bearer " + testKey}}, 200, ""},
		{"wrong method", "GET", "/v1/messages", http.Header{"X-Api-Key": {testKey}}, 405, typeInvalidRequest},
		{"wrong method of count_tokens", "GET", "/v1/messages/count_tokens", http.Header{"X-Api-Key": {testKey}}, 405, typeInvalidRequest},
		{"unknown path", "POST", "/v1/messages/batches", http.Header{"X-Api-Key": {testKey}}, 404, typeNotFound},
	} {
		r := httptest.NewRequest(tt.method, tt.path, strings.NewReader(plainBody))
		r.Header = tt.header
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tt.status {
			t.Errorf("%s: status %d, want %d: %s", tt.name, w.Code, tt.status, w.Body)
			continue
		}
		if tt.typ != "" {
			if b := errorBodyOf(t, w.Body.String()); b.Error.Type != tt.typ {
				t.Errorf("%s: type %q, want %q", tt.name, b.Error.Type, tt.typ)
			}
		}
	}
}

// The client going away ends the run with ErrClientGone and writes
// nothing more.
func TestClientGoneCancelsTheRun(t *testing.T) {
	f := &ft.Dispatcher{Events: []ft.Step{ft.Text("a")}}
	e := newEnv(t, f)
	ctx, cancel := context.WithCancel(t.Context())
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/messages", strings.NewReader(streamBody))
	r.Header.Set("x-api-key", testKey)
	w := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { defer close(done); e.handler.ServeHTTP(w, r) }()
	for !ran(f) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if run := f.Run(t); !errors.Is(context.Cause(run.Context()), frontend.ErrClientGone) {
		t.Errorf("run cause %v, want ErrClientGone", context.Cause(run.Context()))
	}
	if strings.Contains(w.Body.String(), "event: error") {
		t.Errorf("an error was written to a client that left: %s", w.Body)
	}
	if e.requests(t, "cancelled") != 1 {
		t.Error("not counted as cancelled")
	}
}

// ran reports whether f has started a run.
func ran(f *ft.Dispatcher) bool { return len(f.Runs()) > 0 }
