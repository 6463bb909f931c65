package ollamaapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// TestStartErrorsCarryStatusAndRefusalHeader (issue 4): a scheduler
// refusal says why in X-IOP-Refusal; busy refusals are 429 with
// Retry-After in whole seconds (at least 1), no candidate is 503; a model
// the principal may not use is Ollama's 404; every candidate failing
// before a head is the last failure's status.
func TestStartErrorsCarryStatusAndRefusalHeader(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		status     int
		refusal    string
		retryAfter string
		msg        string // a part of the error
		outcome    string
	}{
		{"queue full", &sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "m1", RetryAfter: time.Second},
			429, "queue_full", "1", `queue full for model "m1"`, "queue_full"},
		{"queue timeout rounds up", &sched.RefusalError{Reason: sched.ReasonQueueTimeout, Model: "m1", RetryAfter: 2500 * time.Millisecond},
			429, "queue_timeout", "3", `queue timeout for model "m1"`, "queue_timeout"},
		{"busy without a hint still says 1s", fmt.Errorf("gateway: %w", &sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "m1"}),
			429, "queue_full", "1", "queue full", "queue_full"},
		{"no candidate", &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: "m1", Detail: "no ready node offers it"},
			503, "no_candidate", "", "no ready node offers it", "no_candidate"},
		{"forbidden", fmt.Errorf("%w: principal may not use route", dispatch.ErrForbidden),
			404, "", "", `model 'm1' not found`, "model_not_found"},
		{"deadline while queued", fmt.Errorf("sched: queued: %w", context.DeadlineExceeded),
			504, "", "", "deadline", "deadline_exceeded"},
		{"every candidate unavailable", &nodeserver.TunnelError{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, Message: "ollama down"}},
			503, "", "", "every candidate failed before answering; the last: the provider is unavailable: ollama down", "provider_unavailable"},
		{"every candidate lost", &nodeserver.TunnelError{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED, Err: errors.New("conn lost")},
			502, "", "", "the Node running the request was lost: conn lost", "node_disconnected"},
		{"model not on the node", &nodeserver.TunnelError{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND, Message: "unknown target"}},
			404, "", "", "the provider does not have the model: unknown target", "model_not_found"},
		{"anything else", errors.New("dispatch: stream limit"), 502, "", "", "could not be dispatched: dispatch: stream limit", "dispatch_failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, &ft.Dispatcher{StartErr: tt.err})
			w := e.do(req(http.MethodPost, "/api/chat", chatBody))
			if w.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.status, w.Body)
			}
			if msg := errorTextOf(t, w.Body.String()); !strings.Contains(msg, tt.msg) {
				t.Errorf("error %q, want it to contain %q", msg, tt.msg)
			}
			if got := w.Header().Get(frontend.RefusalHeader); got != tt.refusal {
				t.Errorf("%s = %q, want %q", frontend.RefusalHeader, got, tt.refusal)
			}
			if got := w.Header().Get("Retry-After"); got != tt.retryAfter {
				t.Errorf("Retry-After = %q, want %q", got, tt.retryAfter)
			}
			if e.requests(t, routeChat, tt.outcome) != 1 {
				t.Errorf("outcome %q not counted", tt.outcome)
			}
		})
	}
}
