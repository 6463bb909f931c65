package frontend

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/inflight"
)

// Causes an exchange is stopped with (see Exchange.Stop); they are also
// what context.Cause reports on the work's context.
var (
	// ErrClientGone: the client closed the connection or stopped reading.
	ErrClientGone = errors.New("client gone")
	// ErrIdleTimeout: nothing went to the client for the profile's
	// idle_timeout.
	ErrIdleTimeout = errors.New("client response idle timeout")
)

// Exchange is one client request's timers and accounting, from arrival to
// its last byte, whatever API it came in by, so that they are written, and
// tested, once (SPEC S5):
//
//   - The request's own context (Begin) is cancelled with ErrClientGone
//     when the client goes away, and with ErrIdleTimeout when nothing has
//     gone to the client for the profile's idle_timeout; the work's
//     context (a run's or a tunnel's) derives from it.
//   - The idle timer runs from admission (Admitted, which the dispatcher
//     calls when the work gets its first slot): the queue wait before it
//     is the queue timeout's alone. The hard deadline runs from arrival,
//     on the work's context. Whichever fires first ends the request, with
//     its own error.
//   - Every write to the client has a deadline of the idle timeout
//     (beforeWrite), so a client that stops reading cannot hold the
//     handler, and the provider slot it holds, forever.
//
// The handler's goroutine alone reads the work and writes the response.
// The idle timer and the client-gone watch only call Stop, which cancels
// the work; the work's terminal brings that news back to the handler's
// goroutine.
type Exchange struct {
	w       http.ResponseWriter
	r       *http.Request
	route   string // the API route label of metrics and the log
	arrived time.Time
	p       auth.Principal
	model   string // the model the request named, once peeked

	metrics *edgemetrics.Metrics
	log     *slog.Logger
	// live is the status page's entry of the work, from its start to the
	// record of its outcome.
	live *inflight.Entry

	// admitted: the dispatcher gave the request a slot for its model, so
	// the model is a name the Edge serves and may label metrics.
	admitted bool

	ctx      context.Context
	cancel   context.CancelCauseFunc
	stopGone func() bool
	idle     *frontdoor.IdleTimer
	wd       *frontdoor.WriteDeadline

	// mu orders Stop against Attach: work attached after the request was
	// stopped is cancelled at once, work attached before is cancelled by
	// Stop.
	mu   sync.Mutex
	work Work

	// more tells, while a relay runs, whether the work's next piece has
	// arrived already (see flush). Only the relaying goroutine uses it.
	more func() bool
	// answered: the answer's first byte went (firstByte). A relay
	// coalesces only from then on (coalesceAfterFirst).
	answered bool
}

// Work is what an exchange runs: a run or a tunnel.
type Work interface {
	// Cancel ends the work with cause; its terminal follows.
	Cancel(cause error)
	// Context is done when the work is cancelled or its deadline passes;
	// its cause says which.
	Context() context.Context
}

// NewExchange starts the life of a request that arrived now, for the
// metrics and log label route. m and log may be nil.
func NewExchange(w http.ResponseWriter, r *http.Request, route string, m *edgemetrics.Metrics, log *slog.Logger) *Exchange {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Exchange{w: w, r: r, route: route, arrived: time.Now(), metrics: m, log: log}
}

// Arrived is when the request arrived.
func (x *Exchange) Arrived() time.Time { return x.arrived }

// Model is the model the request named ("" before it was read).
func (x *Exchange) Model() string { return x.model }

// Principal is who made the request (the zero Principal before it was
// authenticated).
func (x *Exchange) Principal() auth.Principal { return x.p }

// Request is the client's HTTP request.
func (x *Exchange) Request() *http.Request { return x.r }

// Begin starts the request's timers for a profile whose client idle
// timeout is idleAfter (the idle timer waits for Admitted), and returns the
// request's context, which the work's derives from. End releases them.
func (x *Exchange) Begin(idleAfter time.Duration) context.Context {
	x.ctx, x.cancel = context.WithCancelCause(context.WithoutCancel(x.r.Context()))
	x.stopGone = context.AfterFunc(x.r.Context(), func() { x.Stop(ErrClientGone) })
	x.idle = frontdoor.NewIdleTimer(idleAfter, func() { x.Stop(ErrIdleTimeout) })
	x.wd = frontdoor.NewWriteDeadline(x.w, idleAfter)
	return x.ctx
}

// End releases what Begin started. Safe without Begin.
func (x *Exchange) End() {
	if x.ctx == nil {
		return
	}
	x.idle.Stop()
	x.stopGone()
	x.cancel(nil)
}

// Context is the request's own context (nil before Begin).
func (x *Exchange) Context() context.Context { return x.ctx }

// Admitted starts the idle timer: the request has its first slot. The
// dispatcher calls it on the handler's goroutine; later calls do nothing.
func (x *Exchange) Admitted() {
	x.admitted = true
	x.idle.Start()
}

// Attach makes w the request's work: Stop cancels it from now on, and if
// the request was stopped already, w is cancelled at once.
func (x *Exchange) Attach(w Work) {
	x.mu.Lock()
	x.work = w
	cause := context.Cause(x.ctx)
	x.mu.Unlock()
	if cause != nil {
		w.Cancel(cause)
	}
}

// Stop ends the request with cause: its work, if there is one yet, and
// the start, if it is still waiting. The first cause wins. The work hears
// it first, so that whoever sees its terminal also sees its Cancel.
func (x *Exchange) Stop(cause error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.work != nil {
		x.work.Cancel(cause)
	}
	x.cancel(cause)
}

// Why is the cause of the work's context, or of the request's when the
// work has none: the first of client gone, idle timeout and deadline; nil
// while nothing has ended it.
func (x *Exchange) Why() error {
	x.mu.Lock()
	w := x.work
	x.mu.Unlock()
	if w != nil {
		if c := context.Cause(w.Context()); c != nil {
			return c
		}
	}
	if x.ctx == nil {
		return nil
	}
	return context.Cause(x.ctx)
}

// beforeWrite gives the next write to the client its deadline.
func (x *Exchange) beforeWrite() {
	if x.wd != nil {
		x.wd.Extend()
	}
}

// Wrote notes that bytes went to the client (or, for an answer sent
// whole, that the work made progress): the idle timer starts over.
func (x *Exchange) Wrote() {
	if x.idle != nil {
		x.idle.Reset()
	}
}

// flush sends what was written of an event to the client, unless the work
// being relayed already has its next piece whole: that one is written
// first, and one flush (one write to the client) carries both. Under load,
// events that arrive together leave together; a lone event is never held
// back, since nothing is waited for; nor is the answer's first piece
// (coalesceAfterFirst).
func (x *Exchange) flush(rc *http.ResponseController) error {
	if x.more != nil && x.more() {
		return nil
	}
	return rc.Flush()
}

// coalesceAfterFirst lets flush consult ready once the answer's first
// byte has gone. Until then every event is flushed at once: the first
// token of a burst is not held behind the tokens that came with it, which
// may only merge with what follows. A relay calls it after each piece of
// the work it wrote.
func (x *Exchange) coalesceAfterFirst(ready func() bool) {
	if x.more == nil && x.answered {
		x.more = ready
	}
}

// firstByte records the time to first token.
func (x *Exchange) firstByte() {
	x.answered = true
	if x.metrics != nil {
		x.metrics.TimeToFirstToken.WithLabelValues(x.route, x.modelLabel(nil)).Observe(time.Since(x.arrived).Seconds())
	}
}

// active counts the work as in flight, of kind, until the returned
// function is called.
func (x *Exchange) active(kind inflight.Kind) (done func()) {
	if x.metrics == nil {
		return func() {}
	}
	x.metrics.Active.WithLabelValues(string(kind)).Inc()
	return func() { x.metrics.Active.WithLabelValues(string(kind)).Dec() }
}

// modelLabel is the request's model as a label of metrics: the name the
// client asked for once the scheduler took the request for it (it gave the
// request a slot, or refused it for that model: busy, or no Node offers it
// now), so that it names a route or a Node's target; "" before that, so
// that no client can add series with names it makes up.
func (x *Exchange) modelLabel(f *Failure) string {
	if x.admitted || f != nil && f.Refusal != "" {
		return x.model
	}
	return ""
}

// recordLevel is the level a request that ended with f is logged at:
// Debug for a success, Info for a failure, Warn when the client saw part of
// an answer before it (started), unless it went away itself.
func recordLevel(f *Failure, started bool) slog.Level {
	switch {
	case f == nil:
		return slog.LevelDebug
	case started && f != FailClientGone:
		return slog.LevelWarn
	}
	return slog.LevelInfo
}

// logs reports whether a line at level would be written: a success is
// logged at Debug, so its attributes are not built unless they are.
func (x *Exchange) logs(level slog.Level) bool { return x.log.Enabled(x.r.Context(), level) }

// record counts the request's outcome in metrics, ends its status page
// entry and logs it: "ok" (or outcome, if not "", for an answer relayed as
// the provider gave it) when f is nil, else f's code, at recordLevel. The log
// message is msg, with attrs added.
func (x *Exchange) record(msg, outcome string, f *Failure, started bool, attrs ...slog.Attr) {
	level := recordLevel(f, started)
	switch {
	case f != nil:
		outcome = f.Code
	case outcome == "":
		outcome = "ok"
	}
	if x.live != nil {
		reason := outcome
		if reason == "ok" {
			reason = inflight.Completed
		}
		x.live.End(reason)
	}
	if x.metrics != nil {
		x.metrics.Requests.WithLabelValues(x.route, x.modelLabel(f), x.p.Name, outcome).Inc()
		switch f {
		case FailClientGone:
			x.metrics.Cancellations.WithLabelValues("client_gone").Inc()
		case FailIdle:
			x.metrics.Cancellations.WithLabelValues("idle_timeout").Inc()
		case FailDeadline:
			x.metrics.Cancellations.WithLabelValues("deadline").Inc()
		}
	}
	if !x.logs(level) {
		return
	}
	all := []slog.Attr{slog.String("route", x.route), slog.String("principal", x.p.Name), slog.String("outcome", outcome),
		slog.Duration("elapsed", time.Since(x.arrived))}
	if x.model != "" {
		all = append(all, slog.String("model", x.model))
	}
	all = append(all, attrs...)
	if f != nil && f != FailClientGone {
		all = append(all, slog.String("err", f.Message))
	}
	x.log.LogAttrs(x.r.Context(), level, msg, all...)
}
