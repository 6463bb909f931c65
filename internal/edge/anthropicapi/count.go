package anthropicapi

import (
	"net/http"

	"github.com/iop-dev/iop/internal/edge/frontend"
)

// tokenCount is count_tokens' answer, as Anthropic's.
type tokenCount struct {
	InputTokens int64 `json:"input_tokens"`
}

// translateCount makes a count_tokens request's work: the run the same
// body would make as a Messages request (without max_tokens), counted by
// the front end (frontend.CountJob: exact where a candidate's adapter
// tokenizes, else the Edge's estimate, said in X-IOP-Token-Count). Hosted
// tools are dropped or refused as a run's are, so that the count is of
// what the run would be. No session is named: a count warms no model
// server's cache, so it should not move the session's affinity.
func translateCount(t *frontend.Turn) (frontend.Job, *frontend.Failure) {
	req, f := parseCount(t.Body)
	if f != nil {
		return nil, f
	}
	if f := t.DropHostedTools(req.hostedParam, req.hosted); f != nil {
		return nil, f
	}
	t.DropContent(req.dropped)
	return &frontend.CountJob{Run: req.run, Out: func(resp *frontend.Response, tokens int64) bool {
		return shape.WriteJSON(resp, http.StatusOK, tokenCount{InputTokens: tokens})
	}}, nil
}

// peekCount reads a count_tokens body's model; the count is never
// streamed.
func peekCount(body []byte) (frontend.Peek, *frontend.Failure) {
	p, f := peekMessages(body)
	p.Stream = false
	return p, f
}
