package ollama

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/iop-dev/iop/sdk"
)

// maxErrorBody bounds how much of an error answer is read.
const maxErrorBody = 64 << 10

// statusError maps an HTTP error answer of Ollama to an *sdk.Error. The
// message is Ollama's own ({"error": "..."}), which never holds prompt text.
//
// A 404 without Ollama's JSON error body is not "model not found": it is a
// base URL that does not point at Ollama's API, and says so.
func statusError(op string, resp *http.Response) *sdk.Error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	msg, fromOllama := errorMessage(body)
	kind := sdk.KindForHTTPStatus(resp.StatusCode)
	if resp.StatusCode == http.StatusNotFound && !fromOllama {
		kind = sdk.KindUpstream
		msg = "endpoint not found (is base_url an Ollama server?)"
	}
	if msg == "" {
		msg = strings.ToLower(http.StatusText(resp.StatusCode))
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return &sdk.Error{Kind: kind, UpstreamStatus: resp.StatusCode, Retryable: true,
			Message: fmt.Sprintf("ollama %s: %d: %s", op, resp.StatusCode, msg)}
	}
	return &sdk.Error{Kind: kind, UpstreamStatus: resp.StatusCode,
		Message: fmt.Sprintf("ollama %s: %d: %s", op, resp.StatusCode, msg)}
}

// errorMessage extracts Ollama's {"error": "..."}; for any other body it
// returns the body's first line, cut short.
func errorMessage(body []byte) (msg string, fromOllama bool) {
	var eb struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &eb) == nil && eb.Error != "" {
		return eb.Error, true
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
	if len(line) > 200 {
		line = line[:200] + "…"
	}
	return line, false
}

// sendError maps a failure to get a response: the run's own cancellation
// (ctx's error, wrapped, so errors.Is(err, context.Canceled) holds), or a
// server that cannot be reached (KindUnavailable, safe to retry: nothing was
// answered).
func sendError(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("ollama %s: %w", op, ctx.Err())
	}
	return &sdk.Error{Kind: sdk.KindUnavailable, Retryable: true, Err: err,
		Message: fmt.Sprintf("ollama %s: server unreachable: %v", op, err)}
}

// readError maps a failure while reading a response that had started: the
// run's cancellation, or a connection lost mid-answer (KindUnavailable, not
// retryable: part of the answer may have been used).
func readError(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("ollama %s: %w", op, ctx.Err())
	}
	return &sdk.Error{Kind: sdk.KindUnavailable, Err: err,
		Message: fmt.Sprintf("ollama %s: connection lost mid-answer: %v", op, err)}
}
