package openaiapi

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

	"github.com/iop-dev/iop/internal/edge/edgemetrics/metricstest"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// TestRefusalsCarryStatusHeaderAndRetryAfter: a scheduler refusal says why
// in the body's code and in X-IOP-Refusal; busy refusals are 429 with
// Retry-After in whole seconds (at least 1), no candidate is 503 (issue 4).
func TestRefusalsCarryStatusHeaderAndRetryAfter(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		status     int
		refusal    string
		retryAfter string
		code       string
	}{
		{"queue full", &sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "m1", RetryAfter: time.Second},
			429, "queue_full", "1", "queue_full"},
		{"queue timeout rounds up", &sched.RefusalError{Reason: sched.ReasonQueueTimeout, Model: "m1", RetryAfter: 2500 * time.Millisecond},
			429, "queue_timeout", "3", "queue_timeout"},
		{"busy without a hint still says 1s", &sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "m1"},
			429, "queue_full", "1", "queue_full"},
		{"wrapped", fmt.Errorf("gateway: %w", &sched.RefusalError{Reason: sched.ReasonQueueTimeout, Model: "m1", RetryAfter: time.Second}),
			429, "queue_timeout", "1", "queue_timeout"},
		{"no candidate", &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: "m1", Detail: "no ready node offers it"},
			503, "no_candidate", "", "no_candidate"},
		{"every candidate failed before output", &dispatch.RunFailedError{Event: &wirepb.RunEvent{
			Type:    wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, Message: "ollama down"}}},
			503, "", "", "provider_unavailable"},
		{"every candidate lost before output", &dispatch.RunFailedError{Event: &wirepb.RunEvent{
			Type: wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED}},
			502, "", "", "node_disconnected"},
		{"forbidden route", fmt.Errorf("%w: principal may not use route", dispatch.ErrForbidden),
			404, "", "", "model_not_found"},
		{"deadline while queued", fmt.Errorf("sched: queued for %q: %w", "m1", context.DeadlineExceeded),
			504, "", "", "deadline_exceeded"},
		{"anything else", errors.New("dispatch: stream limit"), 502, "", "", "dispatch_failed"},
	}
	for _, tt := range tests {
		for _, body := range []string{streamBody, plainBody} {
			t.Run(fmt.Sprintf("%s stream=%v", tt.name, body == streamBody), func(t *testing.T) {
				e := newEnv(t, &ft.Dispatcher{StartErr: tt.err})
				w := e.do(chatReq(body))
				if w.Code != tt.status {
					t.Fatalf("status %d, want %d: %s", w.Code, tt.status, w.Body)
				}
				if got := w.Header().Get(frontend.RefusalHeader); got != tt.refusal {
					t.Errorf("%s = %q, want %q", frontend.RefusalHeader, got, tt.refusal)
				}
				if got := w.Header().Get("Retry-After"); got != tt.retryAfter {
					t.Errorf("Retry-After = %q, want %q", got, tt.retryAfter)
				}
				b := apiErrorOf(t, w.Body.String())
				if codeOf(b) != tt.code {
					t.Errorf("code = %q, want %q", codeOf(b), tt.code)
				}
				if tt.status == 429 && b.Error.Type != typeRateLimit {
					t.Errorf("type = %q", b.Error.Type)
				}
				if e.requests(t, tt.code) != 1 {
					t.Errorf("requests{outcome=%s} = %v", tt.code, e.requests(t, tt.code))
				}
			})
		}
	}
}

func TestForbiddenModelIsNotFound(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{ResolveErr: fmt.Errorf("%w: no", dispatch.ErrForbidden)})
	w := e.do(chatReq(plainBody))
	b := apiErrorOf(t, w.Body.String())
	if w.Code != http.StatusNotFound || codeOf(b) != "model_not_found" || paramOf(b) != "model" {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if !strings.Contains(b.Error.Message, "m1") {
		t.Errorf("message does not name the model: %s", b.Error.Message)
	}
	if len(e.runner.RunRequests()) != 0 {
		t.Error("a forbidden request was started")
	}
}

func TestAuthFailuresAre401InvalidAPIKey(t *testing.T) {
	tests := []struct {
		name, method, path, auth string
		route                    string
	}{
		{"chat without a key", http.MethodPost, "/v1/chat/completions", "", routeChat},
		{"chat with a wrong key", http.MethodPost, "/v1/chat/completions", "Bearer sk-wrong", routeChat},
		{"models without a key", http.MethodGet, "/v1/models", "", routeModels},
		{"models with a wrong key", http.MethodGet, "/v1/models", "Bearer sk-wrong", routeModels},
		{"one model with a wrong key", http.MethodGet, "/v1/models/m1", "Bearer sk-wrong", routeModels},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, &ft.Dispatcher{})
			r := httptest.NewRequest(tt.method, tt.path, strings.NewReader(plainBody))
			if tt.auth != "" {
				r.Header.Set("Authorization", tt.auth)
			}
			w := e.do(r)
			b := apiErrorOf(t, w.Body.String())
			if w.Code != http.StatusUnauthorized || codeOf(b) != "invalid_api_key" || b.Error.Type != typeInvalidRequest {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if w.Header().Get("WWW-Authenticate") == "" {
				t.Error("no WWW-Authenticate")
			}
			if got := metricstest.Sum(t, e.metrics.Requests, "route", tt.route, "outcome", "unauthenticated"); got != 1 {
				t.Errorf("requests{%s,unauthenticated} = %v", tt.route, got)
			}
			if len(e.runner.RunRequests()) != 0 {
				t.Error("an unauthenticated request was started")
			}
		})
	}
}

func TestBodyTooLargeIs413(t *testing.T) {
	tests := []struct {
		name string
		body string
	}{
		{"body over testMaxRequest", `{"model":"m1","messages":[{"role":"user","content":"` + strings.Repeat("a", testMaxRequest) + `"}]}`},
		{"run request over a stream frame", `{"model":"m1","messages":[{"role":"user","content":"` + strings.Repeat("a", 2<<20) + `"}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, &ft.Dispatcher{})
			w := e.do(chatReq(tt.body))
			b := apiErrorOf(t, w.Body.String())
			if w.Code != http.StatusRequestEntityTooLarge || codeOf(b) != "request_too_large" {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if len(e.runner.RunRequests()) != 0 {
				t.Error("an oversized request was started")
			}
		})
	}
}

func TestModelsListsWhatThePrincipalMayUse(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{Offerings: []dispatch.Offering{{ID: "llama3.2"}, {ID: "qwen3"}}})
	get := func(path string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.Header.Set("Authorization", "Bearer "+testKey)
		return e.do(r)
	}
	w := get("/v1/models")
	want := `{"object":"list","data":[{"id":"llama3.2","object":"model","created":0,"owned_by":"iop"},` +
		`{"id":"qwen3","object":"model","created":0,"owned_by":"iop"}]}`
	if w.Code != http.StatusOK || compact(t, w.Body.String()) != want {
		t.Errorf("status %d\n got %s\nwant %s", w.Code, w.Body, want)
	}
	if w = get("/v1/models/qwen3"); w.Code != http.StatusOK || compact(t, w.Body.String()) != `{"id":"qwen3","object":"model","created":0,"owned_by":"iop"}` {
		t.Errorf("one model: %d %s", w.Code, w.Body)
	}
	if w = get("/v1/models/nope"); w.Code != http.StatusNotFound || codeOf(apiErrorOf(t, w.Body.String())) != "model_not_found" {
		t.Errorf("unknown model: %d %s", w.Code, w.Body)
	}
	if w = get("/v1/audio/speech"); w.Code != http.StatusNotFound || codeOf(apiErrorOf(t, w.Body.String())) != "unknown_url" {
		t.Errorf("unknown route: %d %s", w.Code, w.Body)
	}
	if got := metricstest.Sum(t, e.metrics.Requests, "route", routeModels, "outcome", "ok"); got != 2 {
		t.Errorf("requests{openai_models,ok} = %v", got)
	}
}
