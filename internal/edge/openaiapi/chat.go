package openaiapi

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/gateway"
)

// chat serves POST /v1/chat/completions.
func (h *handler) chat(w http.ResponseWriter, r *http.Request) {
	h.runRequest(w, r, routeChat, parseChat, (*exchange).serve)
}

// runRequest serves a request that becomes one run (chat, text
// completions) on route: parse builds it from the body, serve runs it.
// What a request may make the Edge hold is bounded before it is built
// (P3): the body is read within MaxRequestBytes and the door's memory
// budget; the model is read and the principal's right to it checked before
// the rest is decoded; the decode counts lists as it goes; and the body's
// share of the budget is given back as soon as the run request is built.
func (h *handler) runRequest(w http.ResponseWriter, r *http.Request, route string,
	parse func([]byte) (*parsedChat, *apiError), serve func(*exchange, edgeconfig.Profile) *apiError) {
	arrived := time.Now()
	p, ok := h.authenticate(w, r, route)
	if !ok {
		return
	}
	x := &exchange{Exchange: gateway.NewExchange(w, r, route, h.metrics, h.log), h: h}
	x.Arrived, x.P = arrived, p
	body, err := h.door.ReadBody(w, r, MaxRequestBytes)
	if err != nil {
		x.end(bodyError(err))
		return
	}
	defer body.Release()
	peek, e := peekChat(body.Bytes)
	x.req = &parsedChat{model: peek.Model, stream: peek.Stream}
	x.Model = peek.Model
	if e != nil {
		x.end(e)
		return
	}
	profile, err := h.runner.Profile(p, peek.Model)
	if err != nil {
		x.end(fromFailure(gateway.StartFailure(err, nil, peek.Model)))
		return
	}
	req, e := parse(body.Bytes)
	body.Release()
	if e != nil {
		x.end(e)
		return
	}
	x.req = req
	x.end(serve(x, profile))
}

// exchange is one chat request from parse to its last byte: the lifecycle
// every API shares (gateway.Exchange), and the OpenAI answer.
type exchange struct {
	*gateway.Exchange
	h   *handler
	req *parsedChat
	run Run
	out *output // the response, streamed or aggregated
}

// serve runs the request under profile and returns how it ended: nil for
// success.
func (x *exchange) serve(profile edgeconfig.Profile) *apiError {
	ctx := x.Begin(time.Duration(profile.IdleTimeout))
	defer x.End()
	x.out = newOutput(x)
	if x.req.stream {
		// While the request waits for a slot or a silent prefill, an SSE
		// comment now and then keeps proxies with a first-byte limit from
		// cutting it. It stops before serve returns, so end writes alone.
		stop := x.out.keepAlive(time.Duration(profile.KeepAliveInterval))
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

// end answers e: as an HTTP error if nothing was sent yet, as an SSE error
// event and [DONE] if the stream had started (never a silent end), and
// records the outcome in metrics and the log.
func (x *exchange) end(e *apiError) {
	started := x.out != nil && x.out.started
	if e != nil && e != errGone {
		if started {
			x.out.streamError(e)
		} else {
			x.BeforeWrite()
			writeError(x.W, e)
		}
	}
	attrs := []slog.Attr{}
	if x.req != nil && x.req.model != "" {
		attrs = append(attrs, slog.Bool("stream", x.req.stream))
	}
	if x.run != nil {
		attrs = append(attrs, slog.String("run_id", x.run.ID()))
	}
	var f *gateway.Failure
	if e != nil {
		f = e.failure()
	}
	msg := "openai chat completion"
	if x.Route == routeCompletions {
		msg = "openai text completion"
	}
	x.Record(msg, "ok", f, started, attrs...)
}
