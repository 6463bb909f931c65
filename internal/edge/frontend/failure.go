package frontend

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Failure is why a request was not answered with what it asked for, in
// terms every client API renders in its own shape: the HTTP status before
// output, or an in-stream error after it. Every refusal and failure
// becomes a Failure once, here, by a constructor of this file; the status
// follows from the code (statusOf), so no client API ever picks a status
// number, and the code is the one the metrics, the log and the status page
// show.
type Failure struct {
	// Code is the machine-readable kind: "invalid_request",
	// "model_not_found", "queue_timeout", "response_stalled", a failure
	// kind's name... It is the outcome label of metrics.Requests.
	Code string
	// Status is the HTTP status of the answer before output started.
	Status int
	// Message explains it: lowercase, no final period (each API writes it
	// in its own style), no secrets, no prompt or output text.
	Message string
	// Param is the request field at fault, for an invalid request, in the
	// API's own spelling ("messages[2].content").
	Param string
	// Refusal is the scheduler's reason for a refusal (the X-IOP-Refusal
	// header); RetryAfter the hint a client should wait (Retry-After).
	Refusal    string
	RetryAfter time.Duration
	// Liveness is a stall's classification (the X-IOP-Liveness header).
	Liveness string
	// Model is the model the request named, for model_not_found.
	Model string
	// Verbatim says Message is in the API's own words (its translation
	// wrote it, with Invalid, Unsupported or TooLarge): rendered as it is,
	// not restyled.
	Verbatim bool
}

func (f *Failure) Error() string { return f.Message }

// Headers a failure sets beside each API's error body.
const (
	// RefusalHeader carries a scheduler refusal's reason (queue_full,
	// queue_timeout, no_candidate), so a client or proxy can branch on it
	// without parsing the body.
	RefusalHeader = "X-IOP-Refusal"
	// LivenessHeader carries a stall's liveness classification
	// (request_stalled, provider_unhealthy, health_unknown).
	LivenessHeader = "X-IOP-Liveness"
)

// statusOf is the one mapping of failure codes to HTTP statuses.
func statusOf(code string) int {
	switch code {
	case "invalid_request", "unsupported":
		return http.StatusBadRequest
	case "unauthenticated":
		return http.StatusUnauthorized
	case "model_not_found", "unknown_url":
		return http.StatusNotFound
	case "method_not_allowed":
		return http.StatusMethodNotAllowed
	case "request_timeout":
		return http.StatusRequestTimeout
	case "request_too_large":
		return http.StatusRequestEntityTooLarge
	case sched.ReasonQueueFull, sched.ReasonQueueTimeout, "rate_limited":
		return http.StatusTooManyRequests
	case sched.ReasonNoCandidate, "model_not_ready", "edge_stopping", "server_busy", "credential_unavailable", "provider_unavailable", "capacity_exhausted":
		return http.StatusServiceUnavailable
	case "deadline_exceeded", "idle_timeout", "response_stalled":
		return http.StatusGatewayTimeout
	}
	// A Node, a provider or the wire failed: dispatch_failed,
	// node_disconnected, cancelled (by the Node), protocol, internal,
	// upstream, lease_rejected, upstream_unauthenticated,
	// incomplete_stream...
	return http.StatusBadGateway
}

// fail is the failure of code with message.
func fail(code, message string) *Failure {
	return &Failure{Code: code, Status: statusOf(code), Message: message}
}

// Failures of the timers (SPEC S5), each its own, and of the client
// leaving. Callers must not modify them.
var (
	FailDeadline = fail("deadline_exceeded", "the request did not finish within its deadline")
	FailIdle     = fail("idle_timeout", "nothing was sent for the idle timeout; the request was ended")
	// FailClientGone is never written: there is nobody to write it to.
	// 499 is the status proxies log for it.
	FailClientGone = &Failure{Code: "cancelled", Status: 499, Message: "the client went away"}
)

// Invalid is a request the API cannot take as it is, in the API's own
// words: param is the field at fault (or ""), in the API's spelling.
func Invalid(param, format string, args ...any) *Failure {
	f := invalid(param, format, args...)
	f.Verbatim = true
	return f
}

// Unsupported is a request that asks for what this API or model does not
// do, in the API's own words: the client can change that.
func Unsupported(param, format string, args ...any) *Failure {
	f := unsupported(param, format, args...)
	f.Verbatim = true
	return f
}

// TooLarge is a request past one of the API's bounds (P3), in its own
// words.
func TooLarge(format string, args ...any) *Failure {
	f := tooLarge(format, args...)
	f.Verbatim = true
	return f
}

// invalid, unsupported and tooLarge are the failures of Invalid,
// Unsupported and TooLarge in the front end's words.
func invalid(param, format string, args ...any) *Failure {
	f := fail("invalid_request", fmt.Sprintf(format, args...))
	f.Param = param
	return f
}

func unsupported(param, format string, args ...any) *Failure {
	f := fail("unsupported", fmt.Sprintf(format, args...))
	f.Param = param
	return f
}

func tooLarge(format string, args ...any) *Failure {
	return fail("request_too_large", fmt.Sprintf(format, args...))
}

// Unauthenticated is a request without a valid key.
func Unauthenticated(err error) *Failure { return fail("unauthenticated", err.Error()) }

// UnknownURL is a path the API does not serve.
func UnknownURL(r *http.Request) *Failure {
	return fail("unknown_url", "unknown request URL: "+r.Method+" "+r.URL.Path)
}

// MethodNotAllowed is a known path asked with another method; allow is
// what it takes (the Allow header).
func MethodNotAllowed(r *http.Request, allow string) *Failure {
	return fail("method_not_allowed", "method "+r.Method+" is not allowed for "+r.URL.Path+"; use "+allow)
}

// Upstream is a failure of what the Edge asked the Nodes for itself (a
// metadata call every Node failed).
func Upstream(format string, args ...any) *Failure {
	return fail("upstream", fmt.Sprintf(format, args...))
}

// NoProvider is a request that no connected provider can answer now.
func NoProvider(format string, args ...any) *Failure {
	return fail(sched.ReasonNoCandidate, fmt.Sprintf(format, args...))
}

// IncompleteStream is a provider's stream that ended, completed, without
// the final message its API always sends (what says which): the answer
// was cut short.
func IncompleteStream(what string) *Failure {
	return fail("incomplete_stream", "the provider's stream ended without its final message ("+what+"); the answer is incomplete")
}

// InvalidUpstreamStatus is a provider's response head with a status that
// is not HTTP's.
func InvalidUpstreamStatus(status int32) *Failure {
	return fail("protocol", fmt.Sprintf("the provider answered with an invalid status %d", status))
}

// BodyFailure is how a body the front door refused is answered (P3).
func BodyFailure(err error) *Failure {
	var be *frontdoor.BodyError
	if !errors.As(err, &be) {
		return invalid("", "the request body could not be read: %v", err)
	}
	switch be.Status {
	case http.StatusRequestEntityTooLarge:
		return tooLarge("the request body is larger than the limit of %d bytes (limits.max_request_mib)", be.Limit)
	case http.StatusServiceUnavailable:
		// The door's message names the share that was full (the whole
		// body memory, the principal's, the connection's).
		f := fail("server_busy", be.Error())
		f.RetryAfter = be.RetryAfter
		return f
	case http.StatusRequestTimeout:
		// ... or the rate a trickle fell below.
		return fail("request_timeout", be.Error())
	}
	return invalid("", "the request body could not be read: %v", be.Err)
}

// ModelNotFound is the failure of a model that no Node offers and no route
// names, or that the principal may not use (answered the same, so that a
// key does not learn which routes exist for others).
func ModelNotFound(model string) *Failure {
	f := fail("model_not_found", fmt.Sprintf("model %q not found", model))
	f.Model = model
	return f
}

// ModelNotReady is the failure of a model no Node offers yet, whose Nodes
// are expected back after the Edge restarted (dispatch.ErrNotYetBack): a
// 503 with Retry-After, so that a client retries rather than conclude the
// model does not exist (an SDK's not-found error, the ollama CLI's offer
// to pull it).
func ModelNotReady(err *dispatch.NotYetBackError) *Failure {
	f := fail("model_not_ready", err.Error())
	f.RetryAfter = max(err.RetryAfter, time.Second)
	return f
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

// StartFailure maps what resolving or starting work returned to a
// Failure. cause is the cause of the request's own context (client gone,
// idle timeout), which wins: it is why the start gave up.
func StartFailure(err, cause error, model string) *Failure {
	if f := causeFailure(cause); f != nil {
		return f
	}
	var refusal *sched.RefusalError
	var failed *dispatch.RunFailedError
	var te *nodeserver.TunnelError
	var notBack *dispatch.NotYetBackError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return FailDeadline
	case errors.Is(err, dispatch.ErrForbidden), errors.Is(err, dispatch.ErrUnknownModel):
		return ModelNotFound(model)
	case errors.As(err, &notBack):
		return ModelNotReady(notBack)
	case errors.Is(err, dispatch.ErrUnsupported):
		return unsupported("model", "%s", err.Error())
	case errors.Is(err, dispatch.ErrRequestTooLarge):
		return tooLarge("%s", err.Error())
	case errors.Is(err, dispatch.ErrCredentialUnavailable):
		return fail("credential_unavailable", "the request's provider credential cannot be used now: "+err.Error())
	case errors.As(err, &refusal):
		f := fail(refusal.Reason, refusal.Error())
		f.Refusal = refusal.Reason
		if refusal.Busy() {
			f.RetryAfter = max(refusal.RetryAfter, time.Second)
		}
		return f
	case errors.As(err, &failed):
		return lastCandidate(EndingFailure(dispatch.RunEnding(failed.Event), nil))
	case errors.As(err, &te):
		return lastCandidate(EndingFailure(dispatch.TunnelEnding(te), nil))
	}
	return fail("dispatch_failed", "the request could not be dispatched: "+err.Error())
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

// RunFailure maps a run's (or an embedding call's) terminal other than
// COMPLETED to a Failure. cause is the cause of the work's context, if it
// is done: a client gone, the idle timeout or the deadline explains a
// CANCELLED terminal (and wins over whatever terminal the Node raced it
// with).
func RunFailure(ev *wirepb.RunEvent, cause error) *Failure {
	return EndingFailure(dispatch.RunEnding(ev), cause)
}

// TunnelFailure maps how a tunnel's body ended, when it did not complete,
// to a Failure; cause as for RunFailure. An error that is not a
// *nodeserver.TunnelError is a protocol failure.
func TunnelFailure(err, cause error) *Failure {
	var te *nodeserver.TunnelError
	if !errors.As(err, &te) {
		te = &nodeserver.TunnelError{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROTOCOL, Message: err.Error()}}
	}
	return EndingFailure(dispatch.TunnelEnding(te), cause)
}

// EndingFailure is the one mapping of how work ended to a Failure; cause
// as for RunFailure.
func EndingFailure(e dispatch.Ending, cause error) *Failure {
	if f := causeFailure(cause); f != nil {
		return f
	}
	msg := e.Failure.GetMessage()
	if msg == "" {
		msg = e.Local
	}
	with := func(def string) string {
		if msg == "" {
			return def
		}
		return def + ": " + msg
	}
	switch e.Outcome {
	case dispatch.OutcomeDeadline:
		return FailDeadline
	case dispatch.OutcomeStalled:
		f := fail("response_stalled", "the provider stopped responding: "+StallSummary(e.Stall))
		f.Liveness = e.Stall.GetLivenessClassification()
		return f
	case dispatch.OutcomeCancelled:
		return fail("cancelled", with("the request was cancelled"))
	case dispatch.OutcomeDisconnected:
		return fail("node_disconnected", with("the Node running the request was lost"))
	}
	code := failureCode(e.Failure.GetKind())
	switch e.Failure.GetKind() {
	case wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST:
		return fail(code, with("the provider rejected the request"))
	case wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED:
		// What the request asks for (images, tools, a format) is not
		// something this provider does: the client can change that.
		return fail(code, with("the provider does not support the request"))
	case wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND:
		return fail(code, with("the provider does not have the model"))
	case wirepb.FailureKind_FAILURE_KIND_RATE_LIMITED:
		return fail(code, with("the provider is rate limited"))
	case wirepb.FailureKind_FAILURE_KIND_LEASE_REJECTED:
		return fail(code, with("the Node refused the credential lease ("+e.Failure.GetReason()+")"))
	case wirepb.FailureKind_FAILURE_KIND_UNAUTHENTICATED:
		// The provider refused the Node's credentials, not the client's.
		return fail("upstream_unauthenticated", with("the provider refused its credentials"))
	case wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED:
		return fail(code, with("the provider is unavailable"))
	}
	return fail(code, with("the provider failed"))
}

// failureCode is a failure kind's name as a failure code, e.g.
// "rate_limited".
func failureCode(k wirepb.FailureKind) string {
	if k == wirepb.FailureKind_FAILURE_KIND_UNSPECIFIED {
		return "failed"
	}
	return strings.ToLower(strings.TrimPrefix(k.String(), "FAILURE_KIND_"))
}

// StallSummary describes a stall observation for a client: Node-owned
// facts only (R5), never payload text.
func StallSummary(o *wirepb.StallObservation) string {
	if o == nil {
		return "no progress within the stall timeout"
	}
	ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
	s := fmt.Sprintf("no progress for %v (stall timeout %v); provider health %s, classification %s",
		ms(o.GetSinceLastProgressMs()), ms(o.GetStallTimeoutMs()), o.GetProviderHealth(), o.GetLivenessClassification())
	if o.GetProviderHealth() == quicwire.HealthUnavailable {
		s += "; the target is out of selection until it answers again"
	}
	return s
}
