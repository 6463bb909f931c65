package openaiapi

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
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// RefusalHeader names the response header that carries a scheduler
// refusal's reason (queue_full, queue_timeout, no_candidate) beside the
// error body, so a client or proxy can branch on it without parsing JSON.
const RefusalHeader = "X-IOP-Refusal"

// OpenAI's error types.
const (
	typeInvalidRequest = "invalid_request_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
)

// apiError is an error as the client sees it: an HTTP status before the
// response starts, an SSE error event after.
type apiError struct {
	status  int
	typ     string
	code    string // machine-readable; also the outcome label of metrics.Requests
	param   string // the offending request field, for invalid requests
	message string
	// refusal and retryAfter are set for scheduler refusals.
	refusal    string
	retryAfter time.Duration
	// liveness is a stall's classification (gateway.LivenessHeader).
	liveness string
}

func (e *apiError) Error() string { return e.message }

// errorBody is OpenAI's error shape.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func (e *apiError) body() errorBody {
	var b errorBody
	b.Error.Message, b.Error.Type = e.message, e.typ
	if e.param != "" {
		b.Error.Param = &e.param
	}
	if e.code != "" {
		b.Error.Code = &e.code
	}
	return b
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
	writeJSON(w, e.status, e.body())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // only our own types are written: a bug
		panic(fmt.Sprintf("openaiapi: marshal %T: %v", v, err))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func invalid(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: typeInvalidRequest, code: "invalid_request",
		param: param, message: fmt.Sprintf(format, args...)}
}

// bodyError is how a body the door refused is answered.
func bodyError(err error) *apiError {
	var be *frontdoor.BodyError
	if !errors.As(err, &be) {
		return invalid("", "The request body could not be read: %v", err)
	}
	switch be.Status {
	case http.StatusRequestEntityTooLarge:
		return tooLarge("The request body is larger than %d bytes.", be.Limit)
	case http.StatusServiceUnavailable:
		return &apiError{status: be.Status, typ: typeServer, code: "server_busy", retryAfter: be.RetryAfter,
			message: "The Edge is holding as many request bodies as it may; retry shortly."}
	case http.StatusRequestTimeout:
		return &apiError{status: be.Status, typ: typeInvalidRequest, code: "request_timeout",
			message: "The request body did not arrive in time."}
	}
	return invalid("", "The request body could not be read: %v", be.Err)
}

func tooLarge(format string, args ...any) *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalidRequest, code: "request_too_large",
		message: fmt.Sprintf(format, args...)}
}

// modelNotFound is how a model the principal may not use is answered, too:
// as OpenAI does, without saying whether the model exists for others.
func modelNotFound(model string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: typeInvalidRequest, code: "model_not_found", param: "model",
		message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", model)}
}

// Errors of the timers (SPEC S5), each its own.
var (
	errDeadline = &apiError{status: http.StatusGatewayTimeout, typ: typeServer, code: "deadline_exceeded",
		message: "The request did not finish within its deadline."}
	errIdle = &apiError{status: http.StatusGatewayTimeout, typ: typeServer, code: "idle_timeout",
		message: "No response was sent for the idle timeout; the request was ended."}
	errGone = &apiError{status: 499, typ: typeInvalidRequest, code: "cancelled",
		message: "The client went away."}
)

// startError maps what StartRun returned, or the profile lookup, to what
// the client sees. cause is the cause of the handler's own context (client
// gone or idle timeout), which wins: it is why StartRun gave up.
func startError(err, cause error, model string) *apiError {
	var refusal *sched.RefusalError
	var failed *gateway.RunFailedError
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
		return &apiError{status: http.StatusServiceUnavailable, typ: typeServer, code: "credential_unavailable",
			message: "The request's provider credential cannot be used now: " + err.Error()}
	case errors.As(err, &refusal):
		e := &apiError{status: http.StatusServiceUnavailable, typ: typeServer, code: refusal.Reason,
			refusal: refusal.Reason, message: refusal.Error()}
		if refusal.Busy() {
			e.status, e.typ, e.retryAfter = http.StatusTooManyRequests, typeRateLimit, max(refusal.RetryAfter, time.Second)
		}
		return e
	case errors.As(err, &failed):
		e := terminalError(failed.Event, nil)
		e.message = "Every candidate failed before answering; the last: " + e.message
		return e
	}
	return &apiError{status: http.StatusBadGateway, typ: typeServer, code: "dispatch_failed",
		message: "The request could not be dispatched: " + err.Error()}
}

// terminalError maps a terminal other than COMPLETED to what the client
// sees. cause is the cause of the run's context, if it is done: a client
// gone, the idle timeout or the deadline explains a CANCELLED terminal (and
// wins over whatever terminal the Node raced it with).
func terminalError(ev *wirepb.RunEvent, cause error) *apiError {
	switch {
	case errors.Is(cause, ErrClientGone):
		return errGone
	case errors.Is(cause, context.DeadlineExceeded):
		return errDeadline
	case errors.Is(cause, ErrIdleTimeout):
		return errIdle
	}
	f := ev.GetFailure()
	msg := f.GetMessage()
	with := func(def string) string {
		if msg == "" {
			return def
		}
		return def + ": " + msg
	}
	switch ev.GetType() {
	case wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED:
		return errDeadline
	case wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED:
		return &apiError{status: http.StatusGatewayTimeout, typ: typeServer, code: "response_stalled",
			liveness: ev.GetStall().GetLivenessClassification(),
			message:  "The provider stopped responding: " + gateway.StallSummary(ev.GetStall()) + "."}
	case wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED:
		return &apiError{status: http.StatusBadGateway, typ: typeServer, code: "cancelled",
			message: with("The run was cancelled")}
	case wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED:
		return &apiError{status: http.StatusBadGateway, typ: typeServer, code: "node_disconnected",
			message: with("The Node running the request was lost")}
	}
	e := &apiError{status: http.StatusBadGateway, typ: typeServer, code: gateway.FailureCode(f.GetKind()),
		message: with("The provider failed")}
	switch f.GetKind() {
	case wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST:
		e.status, e.typ, e.message = http.StatusBadRequest, typeInvalidRequest, with("The provider rejected the request")
	case wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED:
		// What the request asks for (images, tools, a format) is not
		// something this provider does: the client can change that.
		e.status, e.typ, e.message = http.StatusBadRequest, typeInvalidRequest, with("The provider does not support the request")
	case wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND:
		e.status, e.typ, e.message = http.StatusNotFound, typeInvalidRequest, with("The provider does not have the model")
	case wirepb.FailureKind_FAILURE_KIND_RATE_LIMITED:
		e.status, e.typ, e.message = http.StatusTooManyRequests, typeRateLimit, with("The provider is rate limited")
	case wirepb.FailureKind_FAILURE_KIND_LEASE_REJECTED:
		e.message = with("The Node refused the credential lease (" + f.GetReason() + ")")
	case wirepb.FailureKind_FAILURE_KIND_UNAUTHENTICATED:
		// The provider refused the Node's credentials, not the client's.
		e.code, e.message = "upstream_unauthenticated", with("The provider refused its credentials")
	case wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED:
		e.status, e.message = http.StatusServiceUnavailable, with("The provider is unavailable")
	}
	return e
}
