package openaiapi

import (
	"github.com/iop-dev/iop/internal/edge/frontend"
)

// translateChat makes a chat request's run: parsed as request.go says,
// written back as output.go says. web_search_options, OpenAI's hosted web
// search, is dropped (X-IOP-Dropped-Tools: web_search) or refused, as the
// route's profile says; the session key is read as session.go says.
func translateChat(t *frontend.Turn) (frontend.Job, *frontend.Failure) {
	req, f := parseChat(t.Body)
	if f != nil {
		return nil, f
	}
	if f := t.DropHostedTools("web_search_options", req.hosted); f != nil {
		return nil, f
	}
	t.Session = sessionKey(t.Exchange().Request(), req.promptCacheKey, req.user, req.safetyIdentifier)
	return req.job(newOutput(t.Exchange(), t.Response(), req)), nil
}

// job is req's run, written by out; a stream gets keep-alive comments.
func (req *parsedChat) job(out frontend.RunWriter) *frontend.RunJob {
	j := &frontend.RunJob{Run: req.run, Out: out}
	if req.stream {
		// While the request waits for a slot or a silent prefill, an SSE
		// comment now and then keeps proxies with a first-byte limit from
		// cutting it; clients ignore comment lines.
		j.KeepAlive = []byte(": keep-alive\n\n")
	}
	return j
}
