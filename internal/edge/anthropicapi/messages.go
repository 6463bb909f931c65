package anthropicapi

import (
	"github.com/iop-dev/iop/internal/edge/frontend"
)

// translateMessages makes a Messages request's run: parsed as request.go
// says, written back as output.go says. The hosted tools it declares are
// dropped (named in X-IOP-Dropped-Tools) or refused, as the route's
// profile says; content the model cannot read is named in
// X-IOP-Dropped-Content; the session it is a turn of is named for
// affinity.
func translateMessages(t *frontend.Turn) (frontend.Job, *frontend.Failure) {
	req, f := parseMessages(t.Body)
	if f != nil {
		return nil, f
	}
	if f := t.DropHostedTools(req.hostedParam, req.hosted); f != nil {
		return nil, f
	}
	t.DropContent(req.dropped)
	t.Session = sessionKey(t.Exchange().Request().Header, req.userID)
	j := &frontend.RunJob{Run: req.run, Out: newOutput(t.Response(), req)}
	if req.stream {
		// While the request waits for a slot or a silent prefill, a ping
		// now and then keeps proxies with a first-byte limit from cutting
		// it; the first commits the response with message_start.
		j.KeepAlive = []byte("event: ping\ndata: {\"type\":\"ping\"}\n\n")
	}
	return j, nil
}
