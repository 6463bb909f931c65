package openaiapi

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/gateway"
)

// routeResponses is the route label of the Responses API in metrics and
// logs.
const routeResponses = "openai_responses"

// responses serves POST /v1/responses, OpenAI's Responses API, on the one
// normalized run (SPEC R2, P2): the request is translated as
// responses_request.go says, the answer written as responses_output.go
// says. Its life is chat's (gateway.Exchange): authenticate, read the body
// within its bounds (P3), check the model before decoding the rest, start
// the run, relay its events until the terminal. Errors before the response
// starts are HTTP errors in OpenAI's shape; after, an error event and
// response.failed.
func (h *handler) responses(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	p, ok := h.authenticate(w, r, routeResponses)
	if !ok {
		return
	}
	x := &respExchange{Exchange: gateway.NewExchange(w, r, routeResponses, h.metrics, h.log), h: h}
	x.Arrived, x.P = arrived, p
	body, err := h.door.ReadBody(w, r, MaxRequestBytes)
	if err != nil {
		x.end(bodyError(err))
		return
	}
	defer body.Release()
	peek, e := peekChat(body.Bytes)
	x.Model, x.stream = peek.Model, peek.Stream
	if e != nil {
		x.end(e)
		return
	}
	profile, err := h.runner.Profile(p, peek.Model)
	if err != nil {
		x.end(fromFailure(gateway.StartFailure(err, nil, peek.Model)))
		return
	}
	req, e := parseResponses(body.Bytes)
	body.Release()
	if e != nil {
		x.end(e)
		return
	}
	x.req = req
	x.end(x.serve(profile))
}

// respExchange is one Responses request from parse to its last byte.
type respExchange struct {
	*gateway.Exchange
	h      *handler
	stream bool // as the body said, for the log before it is parsed
	req    *parsedResponses
	run    Run
	out    *respOutput
}

// serve runs the request under profile and returns how it ended: nil for
// success.
func (x *respExchange) serve(profile edgeconfig.Profile) *apiError {
	ctx := x.Begin(time.Duration(profile.IdleTimeout))
	defer x.End()
	x.out = newRespOutput(x)
	if x.req.stream {
		// Comments while the request waits for a slot or in a silent
		// prefill, as chat's; they stop before serve returns.
		stop := x.out.sse.keepAlive(time.Duration(profile.KeepAliveInterval))
		defer stop()
	}

	run, err := x.h.runner.StartRun(ctx, x.P, x.req.model, x.req.run, x.Admitted)
	if err != nil {
		return fromFailure(gateway.StartFailure(err, context.Cause(ctx), x.req.model))
	}
	x.run = run
	defer run.Close()
	x.Attach(run)
	defer x.Active("run")()

	x.out.setID(run.ID())
	if f := x.Relay(run, x.out); f != nil {
		return fromFailure(f)
	}
	return nil
}

// end answers e: as an HTTP error if nothing was sent yet, as an error
// event and response.failed if the stream had started (never a silent
// end), and records the outcome in metrics and the log.
func (x *respExchange) end(e *apiError) {
	started := x.out != nil && x.out.sse.started
	if e != nil && e != errGone {
		if started {
			x.out.fail(e, x.out.usage)
		} else {
			x.BeforeWrite()
			writeError(x.W, e)
		}
	}
	attrs := []slog.Attr{slog.Bool("stream", x.stream)}
	if x.run != nil {
		attrs = append(attrs, slog.String("run_id", x.run.ID()))
	}
	var f *gateway.Failure
	if e != nil {
		f = e.failure()
	}
	x.Record("openai response", "ok", f, started, attrs...)
}
