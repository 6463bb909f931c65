package openaiapi

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/iop-dev/iop/edged/auth"
	"github.com/iop-dev/iop/edged/frontdoor"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// chat serves POST /v1/chat/completions. What a request may make the Edge
// hold is bounded before it is built (P3): the body is read within
// MaxRequestBytes and the door's memory budget; the model is read and the
// principal's right to it checked before the rest is decoded; the decode
// counts messages and parts as it goes; and the body's share of the budget
// is given back as soon as the run request is built.
func (h *handler) chat(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	p, ok := h.authenticate(w, r, routeChat)
	if !ok {
		return
	}
	x := &exchange{h: h, w: w, r: r, p: p, arrived: arrived}
	body, err := h.door.ReadBody(w, r, MaxRequestBytes)
	if err != nil {
		x.end(bodyError(err))
		return
	}
	defer body.Release()
	peek, e := peekChat(body.Bytes)
	x.req = &parsedChat{model: peek.Model, stream: peek.Stream}
	if e != nil {
		x.end(e)
		return
	}
	profile, err := h.runner.Profile(p, peek.Model)
	if err != nil {
		x.end(startError(err, nil, peek.Model))
		return
	}
	req, e := parseChat(body.Bytes)
	body.Release()
	if e != nil {
		x.end(e)
		return
	}
	x.req = req
	x.idleAfter = time.Duration(profile.IdleTimeout)
	x.wd = frontdoor.NewWriteDeadline(w, x.idleAfter)
	x.end(x.serve())
}

// exchange is one chat request from parse to its last byte. The handler's
// goroutine alone reads the run and writes the response. The idle timer
// and the client-gone watch only call stop, which cancels the run; the
// run's terminal brings that news back to the handler's goroutine.
type exchange struct {
	h       *handler
	w       http.ResponseWriter
	r       *http.Request
	p       auth.Principal
	req     *parsedChat
	arrived time.Time

	// ctx is the request's own context, cancelled with ErrClientGone when
	// the client goes away and with ErrIdleTimeout by the idle timer; the
	// run's context derives from it.
	ctx       context.Context
	cancel    context.CancelCauseFunc
	idleAfter time.Duration
	idle      *frontdoor.IdleTimer
	wd        *frontdoor.WriteDeadline // every write's deadline: the idle timeout
	run       Run

	// mu orders stop against the run's start: a run started after the
	// request was stopped is cancelled at once, one started before is
	// cancelled by stop.
	mu   sync.Mutex
	live Run

	out *output // the response, streamed or aggregated
}

// serve runs the request and returns how it ended: nil for success.
func (x *exchange) serve() *apiError {
	x.ctx, x.cancel = context.WithCancelCause(context.WithoutCancel(x.r.Context()))
	defer x.cancel(nil)
	stopGone := context.AfterFunc(x.r.Context(), func() { x.stop(ErrClientGone) })
	defer stopGone()
	// The idle timer runs from admission: a silent prefill is time without
	// a byte to the client as much as a pause mid-answer, but the queue
	// wait before it is the queue timeout's alone, so a request that waits
	// its queue timeout out is told 429 queue_timeout, whatever the idle
	// timeout. The deadline runs from arrival. Each timer has its own
	// error (SPEC S5); whichever fires first ends the request.
	x.idle = frontdoor.NewIdleTimer(x.idleAfter, func() { x.stop(ErrIdleTimeout) })
	defer x.idle.Stop()

	run, err := x.h.runner.StartRun(x.ctx, x.p, x.req.model, x.req.run, x.idle.Start)
	if err != nil {
		return startError(err, context.Cause(x.ctx), x.req.model)
	}
	x.run = run
	defer run.Close()
	x.mu.Lock()
	x.live = run
	cause := context.Cause(x.ctx)
	x.mu.Unlock()
	if cause != nil {
		run.Cancel(cause)
	}
	if m := x.h.metrics; m != nil {
		m.Active.WithLabelValues("run").Inc()
		defer m.Active.WithLabelValues("run").Dec()
	}

	x.out = newOutput(x, run.ID())
	for {
		ev, err := run.Next()
		if err != nil { // a run always ends with a terminal; this one did not
			ev = &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
				Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROTOCOL, Message: "run ended without a terminal: " + err.Error()}}
		}
		if u := ev.GetUsage(); u != nil {
			x.out.usage = u
		}
		var ok bool
		switch t := ev.GetType(); {
		case t == wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED:
			if !x.out.complete(ev.GetDoneReason()) {
				return errGone
			}
			return nil
		case t > wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED:
			e := terminalError(ev, x.why())
			if x.out.started && e != errGone {
				x.out.streamError(e) // output started: the error goes in-stream
			}
			return e
		case t == wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA:
			ok = x.out.text(ev.GetText())
		case t == wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA:
			ok = x.out.reasoning(ev.GetText())
		case t == wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA:
			ok = x.out.toolCall(ev.GetToolCall())
		default: // usage, and types added later
			ok = true
		}
		if !ok { // a write failed: the client is gone
			x.stop(ErrClientGone)
			return errGone
		}
	}
}

// stop ends the request with cause: the run, if there is one yet, and
// StartRun, if it is still waiting. The first cause wins. The run hears it
// first, so that whoever sees its terminal also sees its Cancel.
func (x *exchange) stop(cause error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.live != nil {
		x.live.Cancel(cause)
	}
	x.cancel(cause)
}

// why is the cause of the run's context, or of the request's when the run
// has none yet: the first of client gone, idle timeout and deadline.
func (x *exchange) why() error {
	if x.run != nil {
		if c := context.Cause(x.run.Context()); c != nil {
			return c
		}
	}
	return context.Cause(x.ctx)
}

// wrote notes that a byte went to the client (or, for a response that is
// sent whole, that the run made progress): the idle timer starts over.
func (x *exchange) wrote() { x.idle.Reset() }

// firstByte records the time to first token.
func (x *exchange) firstByte() {
	if m := x.h.metrics; m != nil {
		m.TimeToFirstToken.WithLabelValues(routeChat).Observe(time.Since(x.arrived).Seconds())
	}
}

// end answers e as an HTTP error if nothing was sent yet, and records the
// outcome in metrics and the log.
func (x *exchange) end(e *apiError) {
	outcome, level := "ok", slog.LevelDebug
	if e != nil {
		outcome, level = e.code, slog.LevelInfo
		if x.out == nil || !x.out.started {
			x.wd.Extend()
			writeError(x.w, e)
		} else {
			level = slog.LevelWarn // the client saw part of an answer, then an error
		}
	}
	x.h.count(routeChat, outcome)
	if m := x.h.metrics; m != nil {
		switch e {
		case errGone:
			m.Cancellations.WithLabelValues("client_gone").Inc()
		case errIdle:
			m.Cancellations.WithLabelValues("idle_timeout").Inc()
		case errDeadline:
			m.Cancellations.WithLabelValues("deadline").Inc()
		}
	}
	attrs := []slog.Attr{slog.String("principal", x.p.Name), slog.String("outcome", outcome),
		slog.Duration("elapsed", time.Since(x.arrived))}
	if x.req != nil && x.req.model != "" {
		attrs = append(attrs, slog.String("model", x.req.model), slog.Bool("stream", x.req.stream))
	}
	if x.run != nil {
		attrs = append(attrs, slog.String("run_id", x.run.ID()))
	}
	if e != nil && e != errGone {
		attrs = append(attrs, slog.String("err", e.message))
	}
	x.h.log.LogAttrs(x.r.Context(), level, "openai chat completion", attrs...)
}
