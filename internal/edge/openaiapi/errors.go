package openaiapi

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
	// f is the gateway failure e renders, if it renders one.
	f *gateway.Failure
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

// Errors of the timers (SPEC S5), each its own, and of the client leaving.
var (
	errDeadline = &apiError{status: http.StatusGatewayTimeout, typ: typeServer, code: "deadline_exceeded",
		message: "The request did not finish within its deadline.", f: gateway.FailDeadline}
	errIdle = &apiError{status: http.StatusGatewayTimeout, typ: typeServer, code: "idle_timeout",
		message: "No response was sent for the idle timeout; the request was ended.", f: gateway.FailIdle}
	errGone = &apiError{status: 499, typ: typeInvalidRequest, code: "cancelled",
		message: "The client went away.", f: gateway.FailClientGone}
)

// fromFailure renders a gateway failure in OpenAI's shape: its status
// picks the error type, and its message becomes a sentence. A model that
// is not found (or that the principal may not use) is answered in
// OpenAI's words, without saying whether it exists for others.
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
	typ := typeServer
	switch f.Status {
	case http.StatusBadRequest, http.StatusNotFound:
		typ = typeInvalidRequest
	case http.StatusTooManyRequests:
		typ = typeRateLimit
	}
	return &apiError{status: f.Status, typ: typ, code: f.Code, message: sentence(f.Message),
		refusal: f.Refusal, retryAfter: f.RetryAfter, liveness: f.Liveness, f: f}
}

// sentence capitalizes m and ends it with a period, as OpenAI writes its
// messages.
func sentence(m string) string {
	if m == "" {
		return m
	}
	m = strings.ToUpper(m[:1]) + m[1:]
	if !strings.HasSuffix(m, ".") {
		m += "."
	}
	return m
}

// failure is e as a gateway failure, for the exchange's record.
func (e *apiError) failure() *gateway.Failure {
	if e.f != nil {
		return e.f
	}
	return &gateway.Failure{Status: e.status, Code: e.code, Message: e.message}
}
