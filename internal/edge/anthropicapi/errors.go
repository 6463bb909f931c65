package anthropicapi

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/iop-dev/iop/internal/edge/frontend"
)

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

// errorBody is Anthropic's error shape, as a response body and as the data
// of an SSE error event.
type errorBody struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// errorOf renders a failure in Anthropic's shape: its status picks the
// error type. This API's own messages (Verbatim) are written as Anthropic
// writes them, starting with the field at fault; every other failure keeps
// the front end's words with its code in front, so that a client's log
// says which outcome it was (Anthropic's error has no code field). A model
// that is not found (or that the principal may not use) is answered in
// Anthropic's words.
func errorOf(f *frontend.Failure) errorBody {
	b := errorBody{Type: "error"}
	b.Error.Type, b.Error.Message = errorType(f.Status), f.Message
	switch {
	case f.Code == "model_not_found" && f.Model != "":
		b.Error.Message = "model: " + f.Model
	case !f.Verbatim && f.Code != "" && !strings.HasPrefix(f.Message, f.Code):
		b.Error.Message = f.Code + ": " + f.Message
	}
	return b
}

// shape is how the Anthropic API answers with JSON and failures.
var shape = &frontend.API{
	ErrorBody: func(f *frontend.Failure) any { return errorOf(f) },
	Trailer:   true,
}

// invalid is a 400 whose message starts with the offending field's path,
// as Anthropic writes them ("messages.0.content.1.source: ...").
func invalid(field, format string, args ...any) *frontend.Failure {
	msg := fmt.Sprintf(format, args...)
	if field != "" {
		msg = field + ": " + msg
	}
	return frontend.Invalid(field, "%s", msg)
}
