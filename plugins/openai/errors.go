package openai

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/iop-dev/iop/sdk"
)

// maxErrorBody bounds how much of an error answer is read.
const maxErrorBody = 64 << 10

// maxMessage bounds an upstream message carried in an error.
const maxMessage = 500

// apiError is an OpenAI error object, {"message","type","code"}. Servers
// vary: code may be a string or a number, and some put the object at the
// top level or send a bare string.
type apiError struct {
	Message string          `json:"message"`
	Type    string          `json:"type"`
	Code    json.RawMessage `json:"code"`
}

func (e apiError) code() string {
	var s string
	if json.Unmarshal(e.Code, &s) == nil {
		return s
	}
	if len(e.Code) > 0 && string(e.Code) != "null" {
		return string(e.Code)
	}
	return ""
}

// parseErrorBody extracts the error object of an error answer, trying in
// turn the OpenAI shape {"error":{...}}, {"error":"text"}, a top-level
// object with "message" (vLLM), and FastAPI's {"detail": ...}.
func parseErrorBody(body []byte) (apiError, bool) {
	var env struct {
		Error  json.RawMessage `json:"error"`
		Detail json.RawMessage `json:"detail"`
		apiError
	}
	if json.Unmarshal(body, &env) != nil {
		return apiError{}, false
	}
	if len(env.Error) > 0 && string(env.Error) != "null" {
		var obj apiError
		if json.Unmarshal(env.Error, &obj) == nil && obj.Message != "" {
			return obj, true
		}
		var text string
		if json.Unmarshal(env.Error, &text) == nil && text != "" {
			return apiError{Message: text}, true
		}
	}
	if env.Message != "" {
		return env.apiError, true
	}
	if len(env.Detail) > 0 {
		var text string
		if json.Unmarshal(env.Detail, &text) == nil {
			return apiError{Message: text}, true
		}
		return apiError{Message: string(env.Detail)}, true
	}
	return apiError{}, false
}

// httpError turns a non-2xx answer into an *sdk.Error whose Kind follows
// the status (sdk.KindForHTTPStatus), refined by the OpenAI error code, and
// whose message is the server's.
func httpError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	status := resp.StatusCode
	e, ok := parseErrorBody(body)
	msg := http.StatusText(status)
	if ok {
		msg = e.Message
	}
	kind := sdk.KindForHTTPStatus(status)
	code := e.code()
	if code == "model_not_found" {
		kind = sdk.KindModelNotFound
	}
	retryable := status == http.StatusTooManyRequests || status == http.StatusBadGateway ||
		status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout
	if code == "insufficient_quota" {
		// A 429 that waiting will not cure.
		retryable = false
	}
	return &sdk.Error{
		Kind:           kind,
		Message:        fmt.Sprintf("openai: upstream %d: %s", status, clip(msg)),
		UpstreamStatus: status,
		Retryable:      retryable,
	}
}

// streamError is an error object received inside a 200 stream.
func streamError(e apiError) error {
	msg := e.Message
	if msg == "" {
		msg = "error object in the stream"
	}
	return &sdk.Error{Kind: sdk.KindUpstream, Message: "openai: upstream error mid-stream: " + clip(msg)}
}

// clip shortens an upstream message to maxMessage bytes on a rune boundary.
func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) <= maxMessage {
		return s
	}
	cut := maxMessage
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
