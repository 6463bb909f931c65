package ollamaapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/gateway"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
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
	// f is the gateway failure e renders, if it renders one.
	f *gateway.Failure
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

// modelNotFound is how a model that no Node offers, or that the principal
// may not use, is answered: as Ollama answers for one it does not have
// (`ollama run` then offers to pull it), without saying whether the model
// exists for others.
func modelNotFound(model string) *apiError {
	return &apiError{status: http.StatusNotFound, code: "model_not_found", message: fmt.Sprintf("model '%s' not found", model)}
}

// Errors of the timers (SPEC S5), each its own, and of the client leaving.
var (
	errDeadline = &apiError{status: http.StatusGatewayTimeout, code: "deadline_exceeded",
		message: gateway.FailDeadline.Message, f: gateway.FailDeadline}
	errIdle = &apiError{status: http.StatusGatewayTimeout, code: "idle_timeout",
		message: gateway.FailIdle.Message, f: gateway.FailIdle}
	errGone = &apiError{status: 499, code: "cancelled", message: gateway.FailClientGone.Message, f: gateway.FailClientGone}
)

// fromFailure renders a gateway failure in Ollama's shape.
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
	return &apiError{status: f.Status, code: f.Code, message: f.Message, refusal: f.Refusal,
		retryAfter: f.RetryAfter, liveness: f.Liveness, f: f}
}

// relayError maps how a tunnel's body ended, when it did not complete, to
// what the client sees. cause is the cause of the tunnel's context, if it
// is done (see gateway.TunnelFailure).
func relayError(err, cause error) *apiError {
	var te *nodeserver.TunnelError
	if !errors.As(err, &te) {
		te = &nodeserver.TunnelError{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROTOCOL, Message: err.Error()}}
	}
	return fromFailure(gateway.TunnelFailure(te, cause))
}

// failure is e as a gateway failure, for the exchange's record.
func (e *apiError) failure() *gateway.Failure {
	if e.f != nil {
		return e.f
	}
	return &gateway.Failure{Status: e.status, Code: e.code, Message: e.message}
}
