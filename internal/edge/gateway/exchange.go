package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/metrics"
)

// Exchange is one client request's life on the Edge, from arrival to its
// last byte, whatever API it came in by: every client API embeds one, so
// the timers and their precedence (SPEC S5) are written, and tested, once.
//
//   - The request's own context (Context) is cancelled with ErrClientGone
//     when the client goes away, and with ErrIdleTimeout when nothing has
//     gone to the client for the profile's idle_timeout; the work's
//     context (a run's or a tunnel's) derives from it.
//   - The idle timer runs from admission (Admitted, which the gateway calls
//     when the request gets its first slot): the queue wait before it is
//     the queue timeout's alone. The hard deadline runs from arrival, on
//     the work's context. Whichever fires first ends the request, with its
//     own error.
//   - Every write to the client has a deadline of the idle timeout
//     (BeforeWrite), so a client that stops reading cannot hold the handler,
//     and the provider slot it holds, forever.
//
// The handler's goroutine alone reads the work and writes the response.
// The idle timer and the client-gone watch only call Stop, which cancels
// the work; the work's terminal brings that news back to the handler's
// goroutine.
type Exchange struct {
	W       http.ResponseWriter
	R       *http.Request
	Route   string // the API route label of metrics
	P       auth.Principal
	Model   string
	Arrived time.Time

	metrics *metrics.Metrics
	log     *slog.Logger

	// admitted: the gateway gave the request a slot for Model (Admitted),
	// so Model is a name the Edge serves and may label metrics.
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

	// more tells, while Relay runs, whether the run's next event has
	// arrived already (see Flush). Only the relaying goroutine uses it.
	more func() bool
}

// Work is what an exchange runs: a run or a tunnel.
type Work interface {
	// Cancel ends the work with cause; its terminal follows.
	Cancel(cause error)
	// Context is done when the work is cancelled or its deadline passes;
	// its cause says which.
	Context() context.Context
}

// NewExchange starts the life of a request that arrived now. m and log
// may be nil.
func NewExchange(w http.ResponseWriter, r *http.Request, route string, m *metrics.Metrics, log *slog.Logger) *Exchange {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Exchange{W: w, R: r, Route: route, Arrived: time.Now(), metrics: m, log: log}
}

// Begin starts the request's timers for a profile whose client idle
// timeout is idleAfter (the idle timer waits for Admitted), and returns the
// request's context, for StartRun or StartTunnel (it carries x, for the
// live tracker: live.go). End releases them.
func (x *Exchange) Begin(idleAfter time.Duration) context.Context {
	x.ctx, x.cancel = context.WithCancelCause(withExchange(context.WithoutCancel(x.R.Context()), x))
	x.stopGone = context.AfterFunc(x.R.Context(), func() { x.Stop(ErrClientGone) })
	x.idle = frontdoor.NewIdleTimer(idleAfter, func() { x.Stop(ErrIdleTimeout) })
	x.wd = frontdoor.NewWriteDeadline(x.W, idleAfter)
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
// gateway calls it on the handler's goroutine; later calls do nothing.
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

// BeforeWrite gives the next write to the client its deadline.
func (x *Exchange) BeforeWrite() { x.wd.Extend() }

// Write writes p to the client with its deadline (BeforeWrite), and notes
// the bytes that went (Wrote): for an answer written in pieces, through a
// buffer.
func (x *Exchange) Write(p []byte) (int, error) {
	x.BeforeWrite()
	n, err := x.W.Write(p)
	if n > 0 {
		x.Wrote()
	}
	return n, err
}

// Wrote notes that bytes went to the client (or, for a response sent
// whole, that the work made progress): the idle timer starts over.
func (x *Exchange) Wrote() {
	if x.idle != nil {
		x.idle.Reset()
	}
}

// FirstByte records the time to first token.
func (x *Exchange) FirstByte() {
	if x.metrics != nil {
		x.metrics.TimeToFirstToken.WithLabelValues(x.Route, x.modelLabel(nil)).Observe(time.Since(x.Arrived).Seconds())
	}
}

// Active counts the work as in flight, of kind "run" or "tunnel", until
// the returned function is called.
func (x *Exchange) Active(kind string) (done func()) {
	if x.metrics == nil {
		return func() {}
	}
	x.metrics.Active.WithLabelValues(kind).Inc()
	return func() { x.metrics.Active.WithLabelValues(kind).Dec() }
}

// modelLabel is the request's model as a label of metrics: the name the
// client asked for once the scheduler took the request for it (it gave the
// request a slot, or refused it for that model: busy, or no Node offers it
// now), so that it names a route or a Node's target; "" before that, so
// that no client can add series with names it makes up.
func (x *Exchange) modelLabel(f *Failure) string {
	if x.admitted || f != nil && f.Refusal != "" {
		return x.Model
	}
	return ""
}

// Record counts the request's outcome in metrics and logs it: "ok" when f
// is nil, else f's code. started says whether the client saw output before
// f (then it is a Warn). The log message is msg, with attrs added.
func (x *Exchange) Record(msg, outcome string, f *Failure, started bool, attrs ...slog.Attr) {
	level := slog.LevelDebug
	if f != nil {
		outcome, level = f.Code, slog.LevelInfo
		if started && f != FailClientGone {
			level = slog.LevelWarn // the client saw part of an answer, then an error
		}
	}
	if x.metrics != nil {
		x.metrics.Requests.WithLabelValues(x.Route, x.modelLabel(f), x.P.Name, outcome).Inc()
		switch f {
		case FailClientGone:
			x.metrics.Cancellations.WithLabelValues("client_gone").Inc()
		case FailIdle:
			x.metrics.Cancellations.WithLabelValues("idle_timeout").Inc()
		case FailDeadline:
			x.metrics.Cancellations.WithLabelValues("deadline").Inc()
		}
	}
	all := []slog.Attr{slog.String("route", x.Route), slog.String("principal", x.P.Name), slog.String("outcome", outcome),
		slog.Duration("elapsed", time.Since(x.Arrived))}
	if x.Model != "" {
		all = append(all, slog.String("model", x.Model))
	}
	all = append(all, attrs...)
	if f != nil && f != FailClientGone {
		all = append(all, slog.String("err", f.Message))
	}
	x.log.LogAttrs(x.R.Context(), level, msg, all...)
}
