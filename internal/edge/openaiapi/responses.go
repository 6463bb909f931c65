package openaiapi

import (
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
	j := &frontend.RunJob{Run: req.run, Out: newRespOutput(t.Exchange(), t.Response(), req)}
	if req.stream {
		// Comments while the request waits for a slot or in a silent
		// prefill, as chat's.
		j.KeepAlive = []byte(": keep-alive\n\n")
	}
	return j, nil
}
