package anthropicapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/gateway"
)

// RefusalHeader names the response header that carries a scheduler
// refusal's reason (queue_full, queue_timeout, no_candidate), as the other
// APIs of the Edge send it.
const RefusalHeader = "X-IOP-Refusal"

// Anthropic's error types (https://docs.anthropic.com/en/api/errors).
const (
	typeInvalidRequest = "invalid_request_error"
	typeAuthentication = "authentication_error"
	typePermission     = "permission_error"
	typeNotFound       = "not_found_error"
	typeTooLarge       = "request_too_large"
	typeRateLimit      = "rate_limit_error"
	typeAPI            = "api_error"
	typeTimeout        = "timeout_error"
	typeOverloaded     = "overloaded_error"
)

// errorType is the Anthropic error type of an HTTP status. Anthropic
// documents one type per status, and invalid_request_error for the other
// 4xx; the Edge's statuses map the same way, with two choices of its own:
//
//   - 503 (no Node can serve the model now, the provider is unavailable,
//     the Edge is holding as many bodies as it may) is overloaded_error, the
//     type Anthropic's clients retry with backoff, but keeps its status:
//     529 is Anthropic's private status, which proxies, metrics and the
//     Edge's other APIs do not know, and the clients branch on the type.
//   - 502 (a provider or a Node failed) is api_error, as 500 is.
func errorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return typeAuthentication
	case http.StatusForbidden:
		return typePermission
	case http.StatusNotFound:
		return typeNotFound
	case http.StatusRequestEntityTooLarge:
		return typeTooLarge
	case http.StatusTooManyRequests:
		return typeRateLimit
	case http.StatusGatewayTimeout:
		return typeTimeout
	case http.StatusServiceUnavailable, 529:
		return typeOverloaded
	}
	if status >= 500 {
		return typeAPI
	}
	return typeInvalidRequest
}

// apiError is an error as the client sees it: an HTTP status before the
// response starts, an SSE error event after.
type apiError struct {
	status  int
	code    string // the outcome label of metrics.Requests; not on the wire (Anthropic's errors have no code)
	message string
	// refusal and retryAfter are set for scheduler refusals.
	refusal    string
	retryAfter time.Duration
	// liveness is a stall's classification (gateway.LivenessHeader).
	liveness string
	// f is the gateway failure e renders, if it renders one.
	f *gateway.Failure
}

func (e *apiError) Error() string { return e.message }

// errorBody is Anthropic's error shape, as a response body and as the data
// of an SSE error event.
type errorBody struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func (e *apiError) body() errorBody {
	b := errorBody{Type: "error"}
	b.Error.Type, b.Error.Message = errorType(e.status), e.message
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
		panic(fmt.Sprintf("anthropicapi: marshal %T: %v", v, err))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// invalid is a 400 whose message starts with the offending field's path,
// as Anthropic writes them ("messages.0.content.1.source: ...").
func invalid(field, format string, args ...any) *apiError {
	msg := fmt.Sprintf(format, args...)
	if field != "" {
		msg = field + ": " + msg
	}
	return &apiError{status: http.StatusBadRequest, code: "invalid_request", message: msg}
}

// bodyError is how a body the door refused is answered.
func bodyError(err error) *apiError {
	var be *frontdoor.BodyError
	if !errors.As(err, &be) {
		return invalid("", "the request body could not be read: %v", err)
	}
	switch be.Status {
	case http.StatusRequestEntityTooLarge:
		return tooLarge("the request body is larger than %d bytes", be.Limit)
	case http.StatusServiceUnavailable:
		return &apiError{status: be.Status, code: "server_busy", retryAfter: be.RetryAfter,
			message: "the Edge is holding as many request bodies as it may; retry shortly"}
	case http.StatusRequestTimeout:
		return &apiError{status: be.Status, code: "request_timeout", message: "the request body did not arrive in time"}
	}
	return invalid("", "the request body could not be read: %v", be.Err)
}

func tooLarge(format string, args ...any) *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, code: "request_too_large", message: fmt.Sprintf(format, args...)}
}

// modelNotFound is how a model the principal may not use is answered, too,
// so that a key does not learn which routes exist for others. The words
// are Anthropic's.
func modelNotFound(model string) *apiError {
	return &apiError{status: http.StatusNotFound, code: "model_not_found", message: "model: " + model}
}

// Errors of the timers (SPEC S5), each its own, and of the client leaving.
var (
	errDeadline = &apiError{status: http.StatusGatewayTimeout, code: "deadline_exceeded",
		message: "the request did not finish within its deadline", f: gateway.FailDeadline}
	errIdle = &apiError{status: http.StatusGatewayTimeout, code: "idle_timeout",
		message: "nothing was sent for the idle timeout; the request was ended", f: gateway.FailIdle}
	errGone = &apiError{status: 499, code: "cancelled", message: "the client went away", f: gateway.FailClientGone}
)

// fromFailure renders a gateway failure in Anthropic's shape: its status
// picks the error type; the message keeps the gateway's words, with the
// failure's code in front so that a client's log says which outcome it was
// (Anthropic's error has no code field).
func fromFailure(f *gateway.Failure) *apiError {
	switch f {
	case gateway.FailClientGone:
		return errGone
	case gateway.FailIdle:
		return errIdle
	case gateway.FailDeadline:
		return errDeadline
	}
	if f.Code == "model_not_found" && f.Model != "" {
		e := modelNotFound(f.Model)
		e.f = f
		return e
	}
	msg := f.Message
	if f.Code != "" && !strings.HasPrefix(msg, f.Code) {
		msg = f.Code + ": " + msg
	}
	return &apiError{status: f.Status, code: f.Code, message: msg,
		refusal: f.Refusal, retryAfter: f.RetryAfter, liveness: f.Liveness, f: f}
}

// failure is e as a gateway failure, for the exchange's record.
func (e *apiError) failure() *gateway.Failure {
	if e.f != nil {
		return e.f
	}
	return &gateway.Failure{Status: e.status, Code: e.code, Message: e.message}
}
