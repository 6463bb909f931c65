package ollamaapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/iop-dev/iop/edged/frontdoor"
	"github.com/iop-dev/iop/edged/gateway"
	"github.com/iop-dev/iop/edged/sched"
	"github.com/iop-dev/iop/edged/transport"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// RefusalHeader names the response header that carries a scheduler
// refusal's reason (queue_full, queue_timeout, no_candidate) beside the
// error body, as the OpenAI-compatible API sends it too: Ollama's error
// shape has no field for it.
const RefusalHeader = "X-IOP-Refusal"

// apiError is an error as the client sees it: an HTTP status with
// {"error": message} before output, that line alone after it.
type apiError struct {
	status  int
	code    string // machine-readable: the outcome label of metrics.Requests
	message string
	// refusal and retryAfter are set for scheduler refusals.
	refusal    string
	retryAfter time.Duration
	// liveness is a stall's classification (gateway.LivenessHeader).
	liveness string
}

func (e *apiError) Error() string { return e.message }

// errorBody is Ollama's error shape.
type errorBody struct {
	Error string `json:"error"`
}

// line is e as one NDJSON line, the in-stream form of an error that the
// official client returns from Chat or Generate.
func (e *apiError) line() []byte {
	b, _ := json.Marshal(errorBody{Error: e.message})
	return append(b, '\n')
}

// writeError answers with e as the HTTP response.
func writeError(w http.ResponseWriter, e *apiError) {
	if e.refusal != "" {
		w.Header().Set(RefusalHeader, e.refusal)
	}
	if e.liveness != "" {
		w.Header().Set(gateway.LivenessHeader, e.liveness)
	}
	if e.status == http.StatusTooManyRequests || e.retryAfter > 0 {
		secs := max(int64(math.Ceil(e.retryAfter.Seconds())), 1)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	writeJSON(w, e.status, errorBody{Error: e.message})
}

// writeJSON writes v as the whole answer.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // only our own types and valid raw JSON are written: a bug
		panic(fmt.Sprintf("ollamaapi: marshal %T: %v", v, err))
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// bodyError is how a body the door refused is answered.
func bodyError(err error) *apiError {
	var be *frontdoor.BodyError
	if !errors.As(err, &be) {
		return &apiError{status: http.StatusBadRequest, code: "invalid_request", message: "reading the request body: " + err.Error()}
	}
	switch be.Status {
	case http.StatusRequestEntityTooLarge:
		return &apiError{status: be.Status, code: "request_too_large",
			message: "request body too large: the limit is " + strconv.FormatInt(be.Limit, 10) + " bytes"}
	case http.StatusServiceUnavailable:
		return &apiError{status: be.Status, code: "server_busy", retryAfter: be.RetryAfter,
			message: "the edge is holding as many request bodies as it may; retry shortly"}
	case http.StatusRequestTimeout:
		return &apiError{status: be.Status, code: "request_timeout", message: "the request body did not arrive in time"}
	}
	return &apiError{status: http.StatusBadRequest, code: "invalid_request", message: "reading the request body: " + be.Err.Error()}
}

func invalid(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: "invalid_request", message: fmt.Sprintf(format, args...)}
}

// modelNotFound is how a model the principal may not use is answered, as
// Ollama answers for one it does not have: a key does not learn which
// routes exist for others.
func modelNotFound(model string) *apiError {
	return &apiError{status: http.StatusNotFound, code: "model_not_found", message: fmt.Sprintf("model %q not found", model)}
}

// Errors of the timers (SPEC S5), each its own, and of the client leaving.
var (
	errDeadline = &apiError{status: http.StatusGatewayTimeout, code: "deadline_exceeded",
		message: "the request did not finish within its deadline"}
	errIdle = &apiError{status: http.StatusGatewayTimeout, code: "idle_timeout",
		message: "nothing was sent for the idle timeout; the request was ended"}
	errGone = &apiError{status: 499, code: "cancelled", message: "the client went away"}
)

// startError maps what StartTunnel returned, or the profile lookup, to
// what the client sees. cause is the cause of the handler's own context
// (client gone or idle timeout), which wins: it is why StartTunnel gave up.
func startError(err, cause error, model string) *apiError {
	var refusal *sched.RefusalError
	var te *transport.TunnelError
	switch {
	case errors.Is(cause, ErrClientGone):
		return errGone
	case errors.Is(cause, ErrIdleTimeout):
		return errIdle
	case errors.Is(err, context.DeadlineExceeded):
		return errDeadline
	case errors.Is(err, gateway.ErrForbidden):
		return modelNotFound(model)
	case errors.Is(err, gateway.ErrCredentialUnavailable):
		return &apiError{status: http.StatusServiceUnavailable, code: "credential_unavailable",
			message: "the request's provider credential cannot be used now: " + err.Error()}
	case errors.As(err, &refusal):
		e := &apiError{status: http.StatusServiceUnavailable, code: refusal.Reason, refusal: refusal.Reason, message: refusal.Error()}
		if refusal.Busy() {
			e.status, e.retryAfter = http.StatusTooManyRequests, max(refusal.RetryAfter, time.Second)
		}
		return e
	case errors.As(err, &te):
		e := terminalError(te, nil)
		e.message = "every candidate failed before answering; the last: " + e.message
		return e
	}
	return &apiError{status: http.StatusBadGateway, code: "dispatch_failed",
		message: "the request could not be dispatched: " + err.Error()}
}

// relayError maps how a tunnel's body ended, when it did not complete, to
// what the client sees. cause is the cause of the tunnel's context, if it
// is done: a client gone, the idle timeout or the deadline explains a
// CANCELLED terminal (and wins over whatever terminal the Node raced it
// with).
func relayError(err, cause error) *apiError {
	var te *transport.TunnelError
	if !errors.As(err, &te) {
		te = &transport.TunnelError{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROTOCOL, Message: err.Error()}}
	}
	return terminalError(te, cause)
}

// terminalError maps a tunnel terminal other than COMPLETED to what the
// client sees.
func terminalError(te *transport.TunnelError, cause error) *apiError {
	switch {
	case errors.Is(cause, ErrClientGone):
		return errGone
	case errors.Is(cause, context.DeadlineExceeded):
		return errDeadline
	case errors.Is(cause, ErrIdleTimeout):
		return errIdle
	}
	f := te.Failure
	msg := f.GetMessage()
	if msg == "" && te.Err != nil {
		msg = te.Err.Error()
	}
	with := func(def string) string {
		if msg == "" {
			return def
		}
		return def + ": " + msg
	}
	switch te.Outcome {
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_DEADLINE_EXCEEDED:
		return errDeadline
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED:
		return &apiError{status: http.StatusGatewayTimeout, code: "response_stalled", liveness: te.Stall.GetLivenessClassification(),
			message: "the provider stopped responding (response stalled): " + gateway.StallSummary(te.Stall)}
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED:
		return &apiError{status: http.StatusBadGateway, code: "cancelled", message: with("the request was cancelled")}
	case wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED:
		return &apiError{status: http.StatusBadGateway, code: "node_disconnected",
			message: with("the Node running the request was lost")}
	}
	e := &apiError{status: http.StatusBadGateway, code: gateway.FailureCode(f.GetKind()), message: with("the provider failed")}
	switch f.GetKind() {
	case wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST:
		e.status, e.message = http.StatusBadRequest, with("the provider rejected the request")
	case wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED:
		e.status, e.message = http.StatusBadRequest, with("the provider does not support the request")
	case wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND:
		e.status, e.message = http.StatusNotFound, with("the provider does not have the model")
	case wirepb.FailureKind_FAILURE_KIND_RATE_LIMITED:
		e.status, e.message = http.StatusTooManyRequests, with("the provider is rate limited")
	case wirepb.FailureKind_FAILURE_KIND_LEASE_REJECTED:
		e.message = with("the Node refused the credential lease (" + f.GetReason() + ")")
	case wirepb.FailureKind_FAILURE_KIND_UNAUTHENTICATED:
		// The provider refused the Node's credentials, not the client's.
		e.code, e.message = "upstream_unauthenticated", with("the provider refused its credentials")
	case wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED:
		e.status, e.message = http.StatusServiceUnavailable, with("the provider is unavailable")
	}
	return e
}
