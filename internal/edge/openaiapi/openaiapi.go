// Package openaiapi is the Edge's OpenAI-compatible client API:
//
//	POST /v1/chat/completions  a chat run, streamed as server-sent events or
//	                           answered as one chat.completion object
//	POST /v1/responses         a run in OpenAI's Responses API (responses.go)
//	POST /v1/completions       a raw text completion run, with suffix for
//	                           fill-in-the-middle (completions.go)
//	POST /v1/embeddings        an embedding call, not a run (embeddings.go)
//	GET  /v1/models            the models the caller may ask for
//	GET  /v1/models/{model}    one of them
//
// It translates between OpenAI's wire shapes and the normalized run of the
// gateway (wirepb.RunRequest in, wirepb.RunEvent out) and owns nothing else:
// routing, admission and failover before the first event happen in
// gateway.StartRun. Every error a client sees has OpenAI's shape
// ({"error":{"message","type","param","code"}}), before the response starts
// as an HTTP status, after it as an SSE error event followed by
// "data: [DONE]": a stream never just stops.
//
// Statuses: 400 invalid_request_error naming the bad param; 401
// invalid_api_key; 404 model_not_found, also for a model the principal may
// not use (gateway.ErrForbidden), as OpenAI answers, so that a key does not
// learn which routes exist; 413 request_too_large; scheduler refusals 429
// with Retry-After when the candidates are busy and 503 when there is none,
// the reason both in the X-IOP-Refusal header and as the code; a provider's
// failure by its kind (see terminalError); 504 for deadline_exceeded,
// response_stalled and idle_timeout.
//
// A request's life, read top to bottom in chat.go: authenticate, parse,
// look up the profile (for the client response-idle timeout), StartRun,
// then relay events until the terminal. Three things can end it early, each
// with its own error (SPEC S5): the client going away (the run is cancelled
// with ErrClientGone), the response-idle timeout (ErrIdleTimeout, 504
// idle_timeout) and the profile's hard deadline (the gateway's run context
// ends; 504 deadline_exceeded).
package openaiapi

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/gateway"
	"github.com/iop-dev/iop/internal/edge/metrics"
	"github.com/iop-dev/iop/internal/edge/nodes"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Runner is what the handlers need from the gateway; tests fake it.
type Runner interface {
	// StartRun resolves model for p and dispatches req, as
	// gateway.Gateway.StartRun does: it returns once the run has produced a
	// first event that is not a refusal or a loss, or with the reason none
	// could. The run's context derives from ctx. admitted, if not nil, is
	// called on the caller's goroutine when the request leaves the queue
	// with its first slot (the queue wait is over).
	StartRun(ctx context.Context, p auth.Principal, model string, req *wirepb.RunRequest, admitted func()) (Run, error)
	// Models lists the models p may ask for.
	Models(p auth.Principal) []gateway.Model
	// Profile is the profile a request by p for model runs under; an error
	// wrapping gateway.ErrForbidden when p may not use it.
	Profile(p auth.Principal, model string) (edgeconfig.Profile, error)
}

// Run is a run in progress, as gateway.Run is: Next yields events until
// exactly one terminal, then io.EOF.
type Run interface {
	// ID is the run id, for chunk ids and logs.
	ID() string
	// Next blocks for the next event.
	Next() (*wirepb.RunEvent, error)
	// Close releases the run, cancelling it if it has not ended. Safe to
	// call more than once.
	Close()
	// Cancel ends the run with cause; Next then yields its terminal.
	Cancel(cause error)
	// Context is done when the run is cancelled or its deadline passes;
	// its cause says which.
	Context() context.Context
}

// Causes the handler cancels runs with; they are also what context.Cause
// reports on the run's context. They are the gateway's (the lifecycle is
// gateway.Exchange's), named here too for this package's callers.
var (
	// ErrClientGone: the client closed the connection or stopped reading.
	ErrClientGone = gateway.ErrClientGone
	// ErrIdleTimeout: nothing went to the client for the profile's
	// idle_timeout.
	ErrIdleTimeout = gateway.ErrIdleTimeout
)

// Route labels of metrics.Requests and metrics.TimeToFirstToken.
const (
	routeChat   = "openai_chat"
	routeModels = "openai_models"
)

// Handler serves the OpenAI-compatible API; see the package comment for
// its routes. m and log may be nil; door bounds request bodies (nil: a door
// with the default limits).
func Handler(r Runner, a *auth.Authenticator, m *metrics.Metrics, log *slog.Logger, door *frontdoor.Door) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if door == nil {
		door = frontdoor.New(frontdoor.Limits{}, nil)
	}
	h := &handler{runner: r, auth: a, metrics: m, log: log, door: door}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", h.chat)
	mux.HandleFunc("POST /v1/responses", h.responses)
	mux.HandleFunc("POST /v1/completions", h.completions)
	mux.HandleFunc("POST /v1/embeddings", h.embeddings)
	mux.HandleFunc("GET /v1/models", h.models)
	mux.HandleFunc("GET /v1/models/{model...}", h.model)
	// A known path with another method is 405 with Allow, in OpenAI's
	// shape (the catch-all below would say 404).
	mux.HandleFunc("/v1/chat/completions", methodNotAllowed(http.MethodPost))
	mux.HandleFunc("/v1/responses", methodNotAllowed(http.MethodPost))
	mux.HandleFunc("/v1/completions", methodNotAllowed(http.MethodPost))
	mux.HandleFunc("/v1/embeddings", methodNotAllowed(http.MethodPost))
	mux.HandleFunc("/v1/models", methodNotAllowed(http.MethodGet+", "+http.MethodHead))
	mux.HandleFunc("/v1/models/{model...}", methodNotAllowed(http.MethodGet+", "+http.MethodHead))
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, typ: typeInvalidRequest, code: "unknown_url",
			message: "Unknown request URL: " + r.Method + " " + r.URL.Path + "."})
	})
	return mux
}

// methodNotAllowed answers a known path asked with the wrong method.
func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, &apiError{status: http.StatusMethodNotAllowed, typ: typeInvalidRequest, code: "method_not_allowed",
			message: "Method " + r.Method + " is not allowed for " + r.URL.Path + "; use " + allow + "."})
	}
}

// handler holds what every request needs.
type handler struct {
	runner  Runner
	auth    *auth.Authenticator
	metrics *metrics.Metrics
	log     *slog.Logger
	door    *frontdoor.Door
}

// authenticate returns r's principal, or answers 401 and returns false.
func (h *handler) authenticate(w http.ResponseWriter, r *http.Request, route string) (auth.Principal, bool) {
	p, err := h.auth.Authenticate(r)
	if err == nil {
		return p, true
	}
	e := &apiError{status: http.StatusUnauthorized, typ: typeInvalidRequest, code: "invalid_api_key", message: err.Error()}
	w.Header().Set("WWW-Authenticate", `Bearer realm="iop"`)
	writeError(w, e)
	h.count(route, "unauthenticated")
	return auth.Principal{}, false
}

// count adds one request that names no model (a listing, or one refused
// before it was read) to metrics.Requests.
func (h *handler) count(route, outcome string) {
	if h.metrics != nil {
		h.metrics.Requests.WithLabelValues(route, "", "", outcome).Inc()
	}
}

// modelObject is one entry of GET /v1/models, in OpenAI's shape.
type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func newModelObject(m gateway.Model) modelObject {
	return modelObject{ID: m.ID, Object: "model", OwnedBy: "iop"}
}

// models lists every model the principal may ask for, whether or not a
// Node serves it right now: a request for one that none serves is refused
// with no_candidate, which says more than its absence from a list would.
func (h *handler) models(w http.ResponseWriter, r *http.Request) {
	p, ok := h.authenticate(w, r, routeModels)
	if !ok {
		return
	}
	list := struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{Object: "list", Data: []modelObject{}}
	for _, m := range h.runner.Models(p) {
		list.Data = append(list.Data, newModelObject(m))
	}
	writeJSON(w, http.StatusOK, list)
	h.count(routeModels, "ok")
}

// model answers GET /v1/models/{model}.
func (h *handler) model(w http.ResponseWriter, r *http.Request) {
	p, ok := h.authenticate(w, r, routeModels)
	if !ok {
		return
	}
	id := r.PathValue("model")
	for _, m := range h.runner.Models(p) {
		if m.ID == id {
			writeJSON(w, http.StatusOK, newModelObject(m))
			h.count(routeModels, "ok")
			return
		}
	}
	writeError(w, modelNotFound(id))
	h.count(routeModels, "model_not_found")
}

// FromGateway adapts g to Runner; reg is the Node registry Models reads.
func FromGateway(g *gateway.Gateway, reg *nodes.Registry) Runner {
	return gatewayRunner{g: g, reg: reg}
}

type gatewayRunner struct {
	g   *gateway.Gateway
	reg *nodes.Registry
}

var _ Runner = gatewayRunner{}

func (gr gatewayRunner) StartRun(ctx context.Context, p auth.Principal, model string, req *wirepb.RunRequest, admitted func()) (Run, error) {
	r, err := gr.g.StartRun(ctx, p, model, req, admitted)
	if err != nil {
		return nil, err
	}
	return gatewayRun{r}, nil
}

func (gr gatewayRunner) Models(p auth.Principal) []gateway.Model { return gr.g.Models(p) }

func (gr gatewayRunner) Profile(p auth.Principal, model string) (edgeconfig.Profile, error) {
	plan, err := gr.g.Resolve(p, model, "")
	return plan.Profile, err
}

// gatewayRun gives *gateway.Run the ID method Run has.
type gatewayRun struct{ *gateway.Run }

func (r gatewayRun) ID() string { return r.Run.ID }
