package frontend

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/internal/edge/sched"
)

// Front is the one front end of the Edge's client APIs: it owns every
// request's life, and the APIs plug their translations into it (see the
// package comment).
type Front struct {
	d       Dispatcher
	auth    *auth.Authenticator
	door    *frontdoor.Door
	metrics *edgemetrics.Metrics
	log     *slog.Logger
	live    *inflight.Tracker
	// stopping: the Edge is stopping and takes no new work (stop.go).
	stopping atomic.Bool
}

// Options are the optional parts of a Front.
type Options struct {
	// Door bounds request bodies; nil: a door with the default limits.
	Door *frontdoor.Door
	// Metrics counts requests, outcomes, first tokens and work in flight;
	// nil counts nothing.
	Metrics *edgemetrics.Metrics
	// Logger logs each request's outcome; nil logs nothing.
	Logger *slog.Logger
	// Live tracks the work in flight for the status page; nil tracks
	// nothing.
	Live *inflight.Tracker
}

// New returns the front end over d, authenticating with a.
func New(d Dispatcher, a *auth.Authenticator, opts Options) *Front {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Door == nil {
		opts.Door = frontdoor.New(frontdoor.Limits{}, nil)
	}
	return &Front{d: d, auth: a, door: opts.Door, metrics: opts.Metrics, log: opts.Logger, live: opts.Live}
}

// API is what one client API says the same way at every endpoint.
type API struct {
	// ErrorBody is f as the API's error body, answered with f.Status
	// before output started.
	ErrorBody func(f *Failure) any
	// Challenge, if not "", is the WWW-Authenticate header of a 401.
	Challenge string
	// ContentType is the Content-Type of its JSON answers; "":
	// application/json.
	ContentType string
	// Trailer, if true, ends a JSON body with a newline.
	Trailer bool
}

// Endpoint is one path of an API that runs a model: what differs from
// another is how its body is read and what it becomes.
type Endpoint struct {
	// Route labels the endpoint's requests in metrics and the log
	// ("openai_chat").
	Route string
	// Log is the message of the line each request is logged with.
	Log string
	// MaxBody bounds the request's body (P3): past it, 413 before any of
	// it is decoded. 0: the Edge's request limit (limits.max_request_mib),
	// which also bounds a larger MaxBody.
	MaxBody int64
	// Peek reads what the front end needs before the body is decoded: the
	// model, and whether the answer streams. Decoding it should allocate
	// nothing but the model's name, however large the body.
	Peek func(body []byte) (Peek, *Failure)
	// Translate turns the body into the work it asks for, under the plan
	// the model resolved to (Turn).
	Translate func(t *Turn) (Job, *Failure)
}

// Peek is what a body says before it is decoded.
type Peek struct {
	Model  string
	Stream bool
}

// Turn is one request between its plan and its work: what a translation
// reads, and what it may ask of the dispatcher.
type Turn struct {
	// Body is the request's body, valid until Translate returns (or, for
	// a TunnelJob, until the tunnel has started).
	Body []byte
	Peek Peek
	// Plan is what the model resolved to, once (route, profile, the
	// candidates' filter, the principal).
	Plan dispatch.Plan
	// Session is the key of the conversation the request is a turn of, as
	// the client names it (a session id header, prompt_cache_key...): the
	// translation sets it, "" for none. Turns of one session prefer the
	// Node that ran the last one (session affinity); a key is never shared
	// across principals.
	Session string
	x       *Exchange
	resp    *Response
	f       *Front
}

// Response is where the answer goes: the job's writer writes through it.
func (t *Turn) Response() *Response { return t.resp }

// Exchange is the request's life: its arrival, principal, model, request.
func (t *Turn) Exchange() *Exchange { return t.x }

// Candidates are the candidates that can serve the plan now.
func (t *Turn) Candidates() []sched.Candidate { return t.f.d.Candidates(t.Plan) }

// Unavailable is nil when work of the plan could be scheduled now, and
// otherwise the failure a start would answer with: unknown model, or known
// but nobody can serve it now.
func (t *Turn) Unavailable() *Failure {
	if err := t.f.d.Available(t.Plan); err != nil {
		return StartFailure(err, nil, t.Plan.Model)
	}
	return nil
}

// Await is Unavailable for a call that may wait: a model that only a
// sleeping Node served is woken, and Await returns once it is ready
// (issue 23), or the failure a start would answer with.
func (t *Turn) Await() *Failure {
	if err := t.f.d.Ready(t.x.Context(), t.Plan); err != nil {
		return StartFailure(err, nil, t.Plan.Model)
	}
	return nil
}

// Handler serves ep of api: the request's life, from the socket to the
// last byte, for every endpoint that runs a model:
//
//	authenticate → some route servable → read the body within its bounds → peek → plan (resolve once)
//	→ translate → begin (timers) → keep-alives → start (the dispatch loop)
//	→ relay → end: the failure in the API's shape, in the stream or as the status → record
//
// What a request may make the Edge hold is bounded before its work is
// built (P3): the body is read only for a caller who could be served,
// within ep.MaxBody and the door's memory budget and its shares; the
// model is read and the principal's right to it checked before the rest
// is decoded; the body's share of the budget is given back as soon as the
// work no longer needs it.
func (f *Front) Handler(api *API, ep *Endpoint) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x := NewExchange(w, r, ep.Route, f.metrics, f.log)
		l := &life{f: f, api: api, ep: ep, x: x, resp: newResponse(x)}
		plan, fl := l.prepare()
		if fl == nil && l.detach() {
			go l.detached(plan)
			return
		}
		l.end(l.serve(plan, fl))
	})
}

// life is one request of an Endpoint from its arrival to its record.
type life struct {
	f    *Front
	api  *API
	ep   *Endpoint
	x    *Exchange
	resp *Response
	peek Peek
	job  Job
	// id is the work's id and node where it ran, once it started; choice
	// is why the scheduler picked that node (sched.Choice, issue 23).
	id, node, choice string
	body             *frontdoor.Body
	outcome          string // the outcome of an answer relayed as the provider gave it
	// dt is the request taken off net/http to wait for its work (detach).
	dt *frontdoor.Detached
}

// serve runs the request prepared (with plan, or its failure fl) and
// returns how it ended: nil for success.
//
// A request waiting for its first byte waits in the job's start, called
// from here, and its goroutine keeps the stack it grew to (P3: ten
// thousand waiting requests are ten thousand such stacks). So the way to
// the work is a function of its own, prepare, whose frame is gone by then,
// and this one holds only what the job needs.
func (l *life) serve(plan *dispatch.Plan, fl *Failure) *Failure {
	defer l.releaseBody()
	if fl != nil {
		return fl
	}
	if a, ok := l.job.(Answer); ok {
		return a(l.resp)
	}
	x := l.x
	ctx := l.begin(plan)
	defer x.End()
	watch := dispatch.Watch{Admitted: x.Admitted, Live: x.live}
	switch j := l.job.(type) {
	case *RunJob:
		return l.run(ctx, plan, j, watch)
	case *TunnelJob:
		return l.tunnel(ctx, plan, j, watch)
	case *EmbedJob:
		return l.embed(ctx, plan, j, watch)
	case *CountJob:
		return l.count(ctx, plan, j, watch)
	}
	panic(fmt.Sprintf("frontend: a job of type %T", l.job))
}

// detach takes the request off net/http (frontdoor.Door.Detach) when its
// job goes to a Node: it may wait there for minutes (a prefill under
// load), and waits in a goroutine of its own (detached) that holds neither
// net/http's buffers for the connection nor the stack of its handler
// chain. An answer of the Edge's own is written at once, by the handler.
func (l *life) detach() bool {
	if _, answer := l.job.(Answer); answer {
		return false
	}
	dt := l.f.door.Detach(l.x.w, l.x.r)
	if dt == nil {
		return false
	}
	l.dt = dt
	l.x.w, l.x.r = dt, dt.Request()
	l.resp.rc = http.NewResponseController(dt)
	return true
}

// detached serves a detached request to its end, and gives its connection
// back. A panic is net/http's to recover no longer: it is recovered here
// as net/http would, logged with its stack, and the connection closed, so
// that one request's bug never takes the Edge down.
func (l *life) detached(plan *dispatch.Plan) {
	defer func() {
		if p := recover(); p != nil {
			l.dt.Abort()
			l.f.log.Error("panic serving a request", "route", l.ep.Route, "remote", l.x.r.RemoteAddr, "panic", p, "stack", string(debug.Stack()))
		}
	}()
	l.end(l.serve(plan, nil))
	l.dt.Finish()
}

// prepare takes the request from its arrival to its job and the plan the
// job runs under (see Handler).
func (l *life) prepare() (*dispatch.Plan, *Failure) {
	x := l.x
	p, err := l.f.auth.Authenticate(x.r)
	if err != nil {
		return nil, Unauthenticated(err)
	}
	x.p = p
	if f := l.f.refuseWhileStopping(); f != nil {
		return nil, f
	}
	// A body larger than one chunk of the door's is read only for a
	// caller who could be served: authenticated (above), and with some
	// route it may use served now. Which route the request wants is in
	// the body, so that check is Resolve's, after it; until then the
	// per-principal share of body memory bounds what a key limited to
	// other routes can hold (P3). A body of one chunk costs no more than
	// the refusal: it is read, and answered precisely (404 for a model
	// outside the principal's routes, 503 for one inside).
	if n := x.r.ContentLength; n < 0 || n > frontdoor.BodyChunk {
		if fl := l.f.servable(p); fl != nil {
			return nil, fl
		}
	}
	l.body, err = l.f.door.ReadBody(x.w, x.r, p.Name, l.ep.MaxBody)
	if err != nil {
		return nil, BodyFailure(err)
	}
	var fl *Failure
	if l.peek, fl = l.ep.Peek(l.body.Bytes); fl != nil {
		return nil, fl
	}
	x.model = l.peek.Model
	plan, err := l.f.d.Resolve(p, l.peek.Model)
	if err != nil {
		return nil, StartFailure(err, nil, l.peek.Model)
	}
	t := &Turn{Body: l.body.Bytes, Peek: l.peek, Plan: plan, x: x, resp: l.resp, f: l.f}
	if l.job, fl = l.ep.Translate(t); fl != nil {
		return nil, fl
	}
	t.Plan.Session = t.Session
	if fl := l.fits(&t.Plan); fl != nil {
		return nil, fl
	}
	if _, tunnel := l.job.(*TunnelJob); !tunnel {
		l.body.Release() // the work is built: the body is not needed again
	}
	return &t.Plan, nil
}

// begin puts the job on the status page and starts the request's timers;
// it returns the context the job runs in.
func (l *life) begin(plan *dispatch.Plan) context.Context {
	x := l.x
	x.live = l.f.live.Start(inflight.Work{Kind: l.job.kind(), API: x.route, Model: x.model, Principal: x.p.Name, Arrived: x.arrived})
	return x.Begin(time.Duration(plan.Profile.IdleTimeout))
}

// releaseBody gives the request's body back, once read.
func (l *life) releaseBody() {
	if l.body != nil {
		l.body.Release()
	}
}

// servable refuses, before its body is read, a request of a principal
// limited to routes of which no Node serves any now: whatever model its
// body names, it could only be refused. A principal that may use every
// route (anonymous, or "*") may name any model a Node offers, so it is
// not checked; nor is a principal made in code without a configuration.
func (f *Front) servable(p auth.Principal) *Failure {
	if p.MayUse(edgeconfig.AllRoutes) || p.Config == nil {
		return nil
	}
	for _, r := range p.Config.Routes {
		if !p.MayUse(r.Name) {
			continue
		}
		if plan, err := f.d.Resolve(p, r.Model); err == nil && f.d.Available(plan) == nil {
			return nil
		}
	}
	fl := fail(sched.ReasonNoCandidate, fmt.Sprintf("no Node serves any of the routes principal %q may use (%s) now; retry when one does",
		p.Name, strings.Join(p.Routes, ", ")))
	fl.Refusal = sched.ReasonNoCandidate
	return fl
}

// wireHeadroom is what the dispatcher and the stream header add to a
// request after the front end sized it (ids, provider, target, lease).
const wireHeadroom = 16 << 10

// fits refuses work too large for the Edge's request limit once
// converted for the Node (413). It travels to the Node in as many frames as
// it needs (transport.SendHeader); the dispatcher offers it only to Nodes
// that take that much (Plan.Size).
func (l *life) fits(plan *dispatch.Plan) *Failure {
	var m proto.Message
	switch j := l.job.(type) {
	case *RunJob:
		m = j.Run
	case *EmbedJob:
		m = j.Embed
	case *CountJob:
		m = j.Run
	default:
		return nil
	}
	n, limit := proto.Size(m), l.f.door.Limits().MaxRequest
	if int64(n) > limit-wireHeadroom {
		return tooLarge("the request is %d bytes once converted for the Node; the limit is %d (limits.max_request_mib)", n, limit-wireHeadroom)
	}
	plan.Size = n + wireHeadroom
	return nil
}

// end answers f: as the API's error with its status if nothing was sent
// yet, in the stream if it had started (never a silent end), and records
// the outcome.
func (l *life) end(f *Failure) {
	started := l.resp.Committed()
	if f != nil && f != FailClientGone {
		switch {
		case !started:
			l.x.beforeWrite()
			l.f.writeError(l.api, l.x.w, f)
		case l.job != nil:
			l.job.fail(l.resp, f)
		}
	}
	if f != nil && f.Code == "unauthenticated" {
		l.f.count(l.ep.Route, f.Code) // nobody to attribute it to, no model read
		return
	}
	var attrs []slog.Attr
	if !l.x.logs(recordLevel(f, started)) {
		l.x.record(l.ep.Log, l.outcome, f, started)
		return
	}
	if l.peek.Model != "" {
		attrs = append(attrs, slog.Bool("stream", l.peek.Stream))
	}
	if l.id != "" {
		attrs = append(attrs, slog.String("id", l.id), slog.String("node", l.node), slog.String("choice", l.choice))
	}
	if l.job != nil {
		if a, ok := l.job.writer().(interface{ LogAttrs() []slog.Attr }); ok {
			attrs = append(attrs, a.LogAttrs()...)
		}
	}
	l.x.record(l.ep.Log, l.outcome, f, started, attrs...)
}

// Listing serves a read of an API that names no model (a model list, a
// version): authenticated, answered with what list returns, counted.
func (f *Front) Listing(api *API, route string, list func(r *http.Request, p auth.Principal) (any, *Failure)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := f.auth.Authenticate(r)
		if err != nil {
			fl := Unauthenticated(err)
			f.writeError(api, w, fl)
			f.count(route, fl.Code)
			return
		}
		v, fl := list(r, p)
		if fl != nil {
			f.writeError(api, w, fl)
			f.count(route, fl.Code)
			f.log.LogAttrs(r.Context(), slog.LevelInfo, "listing failed", slog.String("route", route),
				slog.String("outcome", fl.Code), slog.String("err", fl.Message))
			return
		}
		api.writeJSON(w, http.StatusOK, v)
		f.count(route, "ok")
	})
}

// Refuse serves what the API refuses whatever it carries (an unknown
// path, a wrong method), in the API's shape.
func (f *Front) Refuse(api *API, refusal func(r *http.Request) *Failure) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.writeError(api, w, refusal(r))
	})
}

// MethodNotAllowed serves a known path asked with another method: 405
// with Allow, in the API's shape.
func (f *Front) MethodNotAllowed(api *API, allow string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		f.writeError(api, w, MethodNotAllowed(r, allow))
	})
}

// count adds one request that names no model (a listing, or one refused
// before it was read) to metrics.Requests.
func (f *Front) count(route, outcome string) {
	if f.metrics != nil {
		f.metrics.Requests.WithLabelValues(route, "", "", outcome).Inc()
	}
}

// writeError answers f as the HTTP response, in api's shape, with the
// headers every API sends beside it.
func (f *Front) writeError(api *API, w http.ResponseWriter, fl *Failure) {
	h := w.Header()
	if fl.Refusal != "" {
		h.Set(RefusalHeader, fl.Refusal)
	}
	if fl.Liveness != "" {
		h.Set(LivenessHeader, fl.Liveness)
	}
	if fl.Status == http.StatusTooManyRequests || fl.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(max(int64(math.Ceil(fl.RetryAfter.Seconds())), 1), 10))
	}
	if fl.Status == http.StatusUnauthorized && api.Challenge != "" {
		h.Set("WWW-Authenticate", api.Challenge)
	}
	api.writeJSON(w, fl.Status, api.ErrorBody(fl))
}

// writeJSON writes v as the whole answer with status.
func (api *API) writeJSON(w http.ResponseWriter, status int, v any) {
	b := api.JSON(v)
	w.Header().Set("Content-Type", api.contentType())
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// contentType is the Content-Type of the API's JSON answers.
func (api *API) contentType() string {
	if api.ContentType == "" {
		return "application/json"
	}
	return api.ContentType
}

// WriteJSON answers v whole with status, as the API's JSON answers go.
func (api *API) WriteJSON(resp *Response, status int, v any) bool {
	return resp.Whole(status, api.contentType(), api.JSON(v))
}

// JSON is v encoded as the API's bodies are: with a final newline when
// api.Trailer says so. Only the API's own types are encoded: an error is a
// bug.
func (api *API) JSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("frontend: marshal %T: %v", v, err))
	}
	if api.Trailer {
		b = append(b, '\n')
	}
	return b
}
