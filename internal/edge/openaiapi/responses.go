package openaiapi

import (
	"net/http"

	"github.com/iop-dev/iop/internal/edge/frontend"
)

// translateResponses makes a Responses API request's run, OpenAI's
// Responses API on the one normalized run (SPEC R2, P2): the request is
// translated as responses_request.go says, the answer written as
// responses_output.go says. Errors before the response starts are HTTP
// errors in OpenAI's shape; after, an error event and response.failed.
func translateResponses(t *frontend.Turn) (frontend.Job, *frontend.Failure) {
	req, f := parseResponses(t.Body)
	if f != nil {
		return nil, f
	}
	if f := req.turn(t); f != nil {
		return nil, f
	}
	j := &frontend.RunJob{Run: req.run, Out: newRespOutput(t.Exchange(), t.Response(), req)}
	if req.stream {
		// Comments while the request waits for a slot or in a silent
		// prefill, as chat's.
		j.KeepAlive = []byte(": keep-alive\n\n")
	}
	return j, nil
}

// turn says what the request asks of its turn beyond its run: the hosted
// tools it runs without (or is refused for), and its session.
func (req *parsedResponses) turn(t *frontend.Turn) *frontend.Failure {
	if f := t.DropHostedTools("tools", req.hosted); f != nil {
		return f
	}
	t.Session = sessionKey(t.Exchange().Request(), req.promptCacheKey, req.user, req.safetyIdentifier)
	return nil
}

// translateInputTokens counts the tokens of a Responses request's input
// (POST /v1/responses/input_tokens, OpenAI's count of what a response's
// input_tokens would be): the request is read as a response's is (its
// input may be absent: a count of instructions and tools), and counted by
// a candidate's tokenizer, else estimated (frontend.CountJob, which says
// which in X-IOP-Token-Count). The answer is
// {"object":"response.input_tokens","input_tokens":N}.
func translateInputTokens(t *frontend.Turn) (frontend.Job, *frontend.Failure) {
	req, f := parseResponsesFor(t.Body, true)
	if f != nil {
		return nil, f
	}
	if f := req.turn(t); f != nil {
		return nil, f
	}
	return &frontend.CountJob{Run: req.run, Out: func(resp *frontend.Response, tokens int64) bool {
		return shape.WriteJSON(resp, http.StatusOK, inputTokens{Object: "response.input_tokens", InputTokens: tokens})
	}}, nil
}

// inputTokens is the answer of POST /v1/responses/input_tokens.
type inputTokens struct {
	Object      string `json:"object"`
	InputTokens int64  `json:"input_tokens"`
}

// peekCount reads a count request's model, as peekChat does: a count
// never streams, whatever its body says.
func peekCount(body []byte) (frontend.Peek, *frontend.Failure) {
	p, f := peekChat(body)
	p.Stream = false
	return p, f
}
