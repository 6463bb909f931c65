package openaiapi

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/iop-dev/iop/internal/edge/frontend"
)

// OpenAI's error types.
const (
	typeInvalidRequest = "invalid_request_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
)

// errorBody is OpenAI's error shape.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// errorOf renders a failure in OpenAI's shape, the one way this API words
// every failure: the type follows the status, the message is a sentence
// (this API's own messages are written as sentences already),
// and two codes are OpenAI's own words. A model that is not found (or that
// the principal may not use) is answered as OpenAI answers it, without
// saying whether it exists for others.
func errorOf(f *frontend.Failure) errorBody {
	var b errorBody
	b.Error.Message = f.Message
	if !f.Verbatim {
		b.Error.Message = sentence(f.Message)
	}
	switch {
	case f.Status == http.StatusTooManyRequests:
		b.Error.Type = typeRateLimit
	case f.Status >= 500:
		b.Error.Type = typeServer
	default:
		b.Error.Type = typeInvalidRequest
	}
	code, param := f.Code, f.Param
	switch code {
	case "unauthenticated":
		code = "invalid_api_key"
	case "model_not_found":
		if f.Model != "" {
			param = "model"
			b.Error.Message = fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", f.Model)
		}
	}
	if param != "" {
		b.Error.Param = &param
	}
	if code != "" {
		b.Error.Code = &code
	}
	return b
}

// shape is how the OpenAI API answers with JSON and failures.
var shape = &frontend.API{
	ErrorBody: func(f *frontend.Failure) any { return errorOf(f) },
	Challenge: `Bearer realm="iop"`,
	Trailer:   true,
}

// invalid is a 400 naming the request field at fault.
func invalid(param, format string, args ...any) *frontend.Failure {
	return frontend.Invalid(param, format, args...)
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
