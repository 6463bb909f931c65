package anthropicapi

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/gateway"
)

// messages serves POST /v1/messages. What a request may make the Edge
// hold is bounded before it is built (P3), as for the OpenAI API: the body
// is read within MaxRequestBytes and the door's memory budget; the model
// is read and the principal's right to it checked before the rest is
// decoded; the decode counts messages and blocks as it goes; and the
// body's share of the budget is given back as soon as the run request is
// built.
func (h *handler) messages(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	p, ok := h.authenticate(w, r, routeMessages)
	if !ok {
		return
	}
	x := &exchange{Exchange: gateway.NewExchange(w, r, routeMessages, h.metrics, h.log), h: h}
	x.Arrived, x.P = arrived, p
	body, err := h.door.ReadBody(w, r, MaxRequestBytes)
	if err != nil {
		x.end(bodyError(err))
		return
	}
	defer body.Release()
	peek, e := peekMessages(body.Bytes)
	x.req = &parsedMessages{model: peek.Model, stream: peek.Stream}
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
	req, e := parseMessages(body.Bytes)
	body.Release()
	if e != nil {
		x.end(e)
		return
	}
	x.req = req
	x.end(x.serve(profile))
}

// exchange is one Messages request from parse to its last byte: the
// lifecycle every API shares (gateway.Exchange), and the Anthropic answer.
type exchange struct {
	*gateway.Exchange
	h   *handler
	req *parsedMessages
	run Run
	out *output // the response, streamed or whole
}

// serve runs the request under profile and returns how it ended: nil for
// success.
func (x *exchange) serve(profile edgeconfig.Profile) *apiError {
	ctx := x.Begin(time.Duration(profile.IdleTimeout))
	defer x.End()
	x.out = newOutput(x)
	if x.req.stream {
		// While the request waits for a slot or a silent prefill, a ping
		// now and then keeps proxies with a first-byte limit from cutting
		// it. It stops before serve returns, so end writes alone.
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

	if f := x.Relay(run, x.out); f != nil {
		return fromFailure(f)
	}
	return nil
}

// end answers e: as an HTTP error if nothing was sent yet, as an error
// event if the stream had started (never a silent end), and records the
// outcome in metrics and the log.
func (x *exchange) end(e *apiError) {
	started := x.out != nil && x.out.committed()
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
	if x.out != nil {
		attrs = append(attrs, slog.String("message_id", x.out.id))
	}
	if x.run != nil {
		attrs = append(attrs, slog.String("run_id", x.run.ID()))
	}
	var f *gateway.Failure
	if e != nil {
		f = e.failure()
	}
	x.Record("anthropic message", "ok", f, started, attrs...)
}
