package frontend

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The one mapping of what went wrong to what every client API answers.
func TestStartFailuresHaveOneStatusAndCodeEach(t *testing.T) {
	for _, tt := range []struct {
		name   string
		err    error
		cause  error
		status int
		code   string
	}{
		{"unknown model", fmt.Errorf("%w: x", dispatch.ErrUnknownModel), nil, 404, "model_not_found"},
		{"forbidden", fmt.Errorf("%w: x", dispatch.ErrForbidden), nil, 404, "model_not_found"},
		{"served before the restart, Nodes not back yet", fmt.Errorf("wrapped: %w", &dispatch.NotYetBackError{Model: "m", Remembered: true}), nil, 503, "model_not_ready"},
		{"known but nobody can serve it", &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: "m"}, nil, 503, "no_candidate"},
		{"queue timeout", &sched.RefusalError{Reason: sched.ReasonQueueTimeout, Model: "m"}, nil, 429, "queue_timeout"},
		{"client gone while queued", errors.New("sched: queued"), ErrClientGone, 499, "cancelled"},
		{"idle while starting", errors.New("x"), ErrIdleTimeout, 504, "idle_timeout"},
		{"credential", dispatch.ErrCredentialUnavailable, nil, 503, "credential_unavailable"},
		{"every candidate stalled", &dispatch.RunFailedError{Event: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED}}, nil, 504, "response_stalled"},
		{"no adapter does the work", fmt.Errorf("%w: m", dispatch.ErrUnsupported), nil, 400, "unsupported"},
		{"dispatch", errors.New("boom"), nil, 502, "dispatch_failed"},
	} {
		f := StartFailure(tt.err, tt.cause, "m")
		if f.Status != tt.status || f.Code != tt.code {
			t.Errorf("%s: %d %s, want %d %s", tt.name, f.Status, f.Code, tt.status, tt.code)
		}
	}
	if f := StartFailure(dispatch.ErrUnknownModel, nil, "ghost"); f.Model != "ghost" || f.Message != `model "ghost" not found` {
		t.Errorf("unknown model failure %+v", f)
	}
	// Issue 26: a model whose Nodes are reconnecting to a restarted Edge
	// is "retry", with Retry-After, and says why.
	if f := StartFailure(&dispatch.NotYetBackError{Model: "m", Since: 1500 * time.Millisecond, Remembered: true}, nil, "m"); f.RetryAfter < time.Second ||
		f.Message != `model "m" was served before this Edge restarted 1.5s ago; its Nodes are reconnecting; retry` {
		t.Errorf("a model not yet back: %+v", f)
	}
	if f := StartFailure(&sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "m"}, nil, "m"); f.RetryAfter < time.Second || f.Refusal != "queue_full" {
		t.Errorf("a busy refusal carries no Retry-After or reason: %+v", f)
	}
}

// TestTerminalCauseWins: a CANCELLED terminal is explained by why the
// work's context ended, whatever failure the Node raced it with; an error
// that is no terminal is a protocol failure.
func TestTerminalCauseWins(t *testing.T) {
	te := &nodeserver.TunnelError{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED}
	for cause, want := range map[error]*Failure{
		ErrClientGone:            FailClientGone,
		ErrIdleTimeout:           FailIdle,
		context.DeadlineExceeded: FailDeadline,
	} {
		if got := TunnelFailure(te, cause); got != want {
			t.Errorf("cause %v: %q, want %q", cause, got.Code, want.Code)
		}
		if got := RunFailure(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED}, cause); got != want {
			t.Errorf("run, cause %v: %q, want %q", cause, got.Code, want.Code)
		}
	}
	if got := TunnelFailure(errors.New("stream reset"), nil); got.Status != 502 || got.Code != "protocol" {
		t.Errorf("an error that is no terminal: %d %q", got.Status, got.Code)
	}
}

// Every code has one status (statusOf), and the constructors an API uses
// keep its words.
func TestEveryCodeHasOneStatus(t *testing.T) {
	for code, want := range map[string]int{
		"invalid_request": 400, "unsupported": 400, "unauthenticated": 401, "model_not_found": 404, "unknown_url": 404,
		"method_not_allowed": 405, "request_timeout": 408, "request_too_large": 413, "queue_full": 429, "queue_timeout": 429,
		"rate_limited": 429, "no_candidate": 503, "server_busy": 503, "credential_unavailable": 503,
		"provider_unavailable": 503, "capacity_exhausted": 503, "deadline_exceeded": 504, "idle_timeout": 504,
		"response_stalled": 504, "dispatch_failed": 502, "node_disconnected": 502, "protocol": 502, "incomplete_stream": 502,
		"upstream_unauthenticated": 502, "lease_rejected": 502, "upstream": 502,
	} {
		if got := statusOf(code); got != want {
			t.Errorf("%s: %d, want %d", code, got, want)
		}
	}
	if f := Invalid("messages[0].role", "bad role %q", "x"); f.Status != 400 || f.Param != "messages[0].role" || !f.Verbatim {
		t.Errorf("Invalid: %+v", f)
	}
	if f := BodyFailure(errors.New("read: reset")); f.Status != 400 || f.Verbatim {
		t.Errorf("a body that could not be read: %+v", f)
	}
}
