package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Failure is how a request ended, when it did not complete, in terms every
// client API renders in its own shape: the HTTP status (before output) or
// the in-stream error (after), a machine code, and a message. The mapping
// from what went wrong to a Failure lives here once; the APIs only choose
// the words' shape (OpenAI's sentences, Ollama's lowercase lines).
type Failure struct {
	// Status is the HTTP status to answer with before output started.
	Status int
	// Code is the machine-readable outcome (the outcome label of
	// metrics.Requests): "model_not_found", "queue_timeout",
	// "response_stalled", "idle_timeout", a failure kind's name, ...
	Code string
	// Message explains it, in lowercase, without a final period.
	Message string
	// Refusal is the scheduler's reason for a refusal (the X-IOP-Refusal
	// header); RetryAfter the hint sent with a busy one.
	Refusal    string
	RetryAfter time.Duration
	// Liveness is a stall's classification (LivenessHeader).
	Liveness string
	// Model is the model the request named, for a model_not_found.
	Model string
}

func (f *Failure) Error() string { return f.Message }

// Causes an exchange is stopped with (see Exchange.Stop); they are also what
// context.Cause reports on the work's context.
var (
	// ErrClientGone: the client closed the connection or stopped reading.
	ErrClientGone = errors.New("client gone")
	// ErrIdleTimeout: nothing went to the client for the profile's
	// idle_timeout.
	ErrIdleTimeout = errors.New("client response idle timeout")
)

// Failures of the timers (SPEC S5), each its own, and of the client leaving.
// Callers must not modify them.
var (
	FailDeadline = &Failure{Status: http.StatusGatewayTimeout, Code: "deadline_exceeded",
		Message: "the request did not finish within its deadline"}
	FailIdle = &Failure{Status: http.StatusGatewayTimeout, Code: "idle_timeout",
		Message: "nothing was sent for the idle timeout; the request was ended"}
	FailClientGone = &Failure{Status: 499, Code: "cancelled", Message: "the client went away"}
)

// ModelNotFound is the failure of a model that no Node offers and no route
// names, or that the principal may not use (answered the same, so that a
// key does not learn which routes exist for others).
func ModelNotFound(model string) *Failure {
	return &Failure{Status: http.StatusNotFound, Code: "model_not_found", Model: model,
		Message: fmt.Sprintf("model %q not found", model)}
}

// causeFailure is the failure a cause explains: the client gone, the idle
// timeout or the deadline; nil for any other cause.
func causeFailure(cause error) *Failure {
	switch {
	case errors.Is(cause, ErrClientGone):
		return FailClientGone
	case errors.Is(cause, ErrIdleTimeout):
		return FailIdle
	case errors.Is(cause, context.DeadlineExceeded):
		return FailDeadline
	}
	return nil
}

// StartFailure maps what StartRun or StartTunnel returned (or the profile
// lookup) to a Failure. cause is the cause of the exchange's own context
// (client gone, idle timeout), which wins: it is why the start gave up.
func StartFailure(err, cause error, model string) *Failure {
	if f := causeFailure(cause); f != nil {
		return f
	}
	var refusal *sched.RefusalError
	var failed *RunFailedError
	var te *nodeserver.TunnelError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return FailDeadline
	case errors.Is(err, ErrForbidden), errors.Is(err, ErrUnknownModel):
		return ModelNotFound(model)
	case errors.Is(err, ErrUnsupported):
		return &Failure{Status: http.StatusBadRequest, Code: "unsupported", Message: err.Error()}
	case errors.Is(err, ErrCredentialUnavailable):
		return &Failure{Status: http.StatusServiceUnavailable, Code: "credential_unavailable",
			Message: "the request's provider credential cannot be used now: " + err.Error()}
	case errors.As(err, &refusal):
		f := &Failure{Status: http.StatusServiceUnavailable, Code: refusal.Reason, Refusal: refusal.Reason, Message: refusal.Error()}
		if refusal.Busy() {
			f.Status, f.RetryAfter = http.StatusTooManyRequests, max(refusal.RetryAfter, time.Second)
		}
		return f
	case errors.As(err, &failed):
		return lastCandidate(RunFailure(failed.Event, nil))
	case errors.As(err, &te):
		return lastCandidate(TunnelFailure(te, nil))
	}
	return &Failure{Status: http.StatusBadGateway, Code: "dispatch_failed",
		Message: "the request could not be dispatched: " + err.Error()}
}

// lastCandidate says that f ended the last of the candidates tried.
func lastCandidate(f *Failure) *Failure {
	if f == FailDeadline || f == FailIdle || f == FailClientGone {
		return f
	}
	c := *f
	c.Message = "every candidate failed before answering; the last: " + c.Message
	return &c
}

// RunFailure maps a run's terminal other than COMPLETED to a Failure.
// cause is the cause of the run's context, if it is done: a client gone,
// the idle timeout or the deadline explains a CANCELLED terminal (and wins
// over whatever terminal the Node raced it with).
func RunFailure(ev *wirepb.RunEvent, cause error) *Failure {
	if f := causeFailure(cause); f != nil {
		return f
	}
	return terminalFailure(terminalOf(ev.GetType()), ev.GetFailure(), ev.GetStall(), "")
}

// TunnelFailure maps how a tunnel ended, when it did not complete, to a
// Failure; cause as for RunFailure.
func TunnelFailure(te *nodeserver.TunnelError, cause error) *Failure {
	if f := causeFailure(cause); f != nil {
		return f
	}
	local := ""
	if te.Err != nil {
		local = te.Err.Error()
	}
	return terminalFailure(tunnelTerminalOf(te.Outcome), te.Failure, te.Stall, local)
}

// terminal is the one outcome of a run or a tunnel.
type terminal int

const (
	terminalFailed terminal = iota
	terminalCancelled
	terminalStalled
	terminalDeadline
	terminalDisconnected
)

func terminalOf(t wirepb.RunEventType) terminal {
	switch t {
	case wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED:
		return terminalCancelled
	case wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED:
		return terminalStalled
	case wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED:
		return terminalDeadline
	case wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED:
		return terminalDisconnected
	}
	return terminalFailed
}

func tunnelTerminalOf(o wirepb.TunnelOutcome) terminal {
	switch o {
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED:
		return terminalCancelled
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED:
		return terminalStalled
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_DEADLINE_EXCEEDED:
		return terminalDeadline
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED:
		return terminalDisconnected
	}
	return terminalFailed
}

// terminalFailure is the one mapping of terminals and failure kinds to
// statuses and codes. local is the Edge's own explanation when the
// failure carries no message.
func terminalFailure(t terminal, f *wirepb.Failure, stall *wirepb.StallObservation, local string) *Failure {
	msg := f.GetMessage()
	if msg == "" {
		msg = local
	}
	with := func(def string) string {
		if msg == "" {
			return def
		}
		return def + ": " + msg
	}
	switch t {
	case terminalDeadline:
		return FailDeadline
	case terminalStalled:
		return &Failure{Status: http.StatusGatewayTimeout, Code: "response_stalled", Liveness: stall.GetLivenessClassification(),
			Message: "the provider stopped responding: " + StallSummary(stall)}
	case terminalCancelled:
		return &Failure{Status: http.StatusBadGateway, Code: "cancelled", Message: with("the request was cancelled")}
	case terminalDisconnected:
		return &Failure{Status: http.StatusBadGateway, Code: "node_disconnected", Message: with("the Node running the request was lost")}
	}
	e := &Failure{Status: http.StatusBadGateway, Code: FailureCode(f.GetKind()), Message: with("the provider failed")}
	switch f.GetKind() {
	case wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST:
		e.Status, e.Message = http.StatusBadRequest, with("the provider rejected the request")
	case wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED:
		// What the request asks for (images, tools, a format) is not
		// something this provider does: the client can change that.
		e.Status, e.Message = http.StatusBadRequest, with("the provider does not support the request")
	case wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND:
		e.Status, e.Message = http.StatusNotFound, with("the provider does not have the model")
	case wirepb.FailureKind_FAILURE_KIND_RATE_LIMITED:
		e.Status, e.Message = http.StatusTooManyRequests, with("the provider is rate limited")
	case wirepb.FailureKind_FAILURE_KIND_LEASE_REJECTED:
		e.Message = with("the Node refused the credential lease (" + f.GetReason() + ")")
	case wirepb.FailureKind_FAILURE_KIND_UNAUTHENTICATED:
		// The provider refused the Node's credentials, not the client's.
		e.Code, e.Message = "upstream_unauthenticated", with("the provider refused its credentials")
	case wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED:
		e.Status, e.Message = http.StatusServiceUnavailable, with("the provider is unavailable")
	}
	return e
}
