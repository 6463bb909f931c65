// Package ollamaapi is the Edge's Ollama-compatible client API, so that the
// ollama CLI (with OLLAMA_HOST) and Ollama clients work against the Edge
// unchanged:
//
//	POST /api/chat, /api/generate,   relayed through the raw provider tunnel
//	     /api/embed, /api/embeddings, (R3) to one Node's Ollama, routed by the
//	     /api/show                    body's "model" ("name" too, for show)
//	GET  /api/tags                   every ready Node's models, merged by name
//	                                 and filtered to what the caller may use
//	GET  /api/ps                     every ready Node's running models
//	GET  /api/version                one ready Node's Ollama version
//	GET  /  (and HEAD /)             "Ollama is running", as Ollama answers
//	                                 the CLI's probe; no key needed
//
// The tunnelled endpoints are not translated: the provider's own request
// and answer pass through, minus hop-by-hop headers and the client's key to
// the Edge. One name is changed: through an alias route (the client's model
// name is not the chosen target's) the provider is asked for the target,
// and the answer gives the client its own name back (alias.go). What the
// package adds is the failure handling Ollama's clients need. Every error
// has Ollama's shape, {"error":"..."}: before output as an HTTP status,
// after it as one more NDJSON line. The official Ollama Go client treats a
// stream that just stops as a success, so a tunnel that ends with anything
// but a completed terminal after output started always gets that line, and
// so does a completed chat or generate stream without its done line
// (ending.go): never a silent end.
//
// Statuses before output: 400 for a body without a model or that is not
// JSON; 401 for a bad or missing key; 404 `model "X" not found`, also for a
// model the principal may not use (gateway.ErrForbidden), as Ollama answers
// for a model it does not have; 413 for a body over maxRequestBody;
// scheduler refusals 429 with Retry-After when the candidates are busy and
// 503 when there is none, the reason in the X-IOP-Refusal header; a
// provider's failure by its kind (see terminalError); 504 for the deadline,
// a stalled response and the idle timeout. Unknown /api/ paths are 404 and
// a wrong method 405, both in the same shape.
//
// A tunnelled request's life, read top to bottom in tunnel.go: authenticate,
// read the body, look up the profile (for the client response-idle
// timeout), StartTunnel, then relay the body read by read until the
// terminal. Three things can end it early, each with its own error (SPEC
// S5): the client going away (the tunnel is cancelled with ErrClientGone,
// which cancels the provider's request through the Node), the
// response-idle timeout (ErrIdleTimeout) and the profile's hard deadline.
package ollamaapi

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/gateway"
	"github.com/iop-dev/iop/internal/edge/metrics"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Adapter is the provider adapter the API's requests go to: a Node's
// Ollama providers.
const Adapter = "ollama"

// Runner is what the handlers need from the gateway; tests fake it.
type Runner interface {
	// StartTunnel resolves model for p among Ollama providers and relays
	// req with a body made by body for the chosen candidate's target to
	// one, as gateway.Gateway.StartTunnel does: it returns once a response
	// head came back, moving to another candidate while none has. The
	// tunnel's context derives from ctx. admitted, if not nil, is called on
	// the caller's goroutine when the request leaves the queue with its
	// first slot.
	StartTunnel(ctx context.Context, p auth.Principal, model string, req *wirepb.TunnelRequest, body gateway.TunnelBody, admitted func()) (Tunnel, error)
	// Profile is the profile a request by p for model runs under; an
	// error wrapping gateway.ErrForbidden when p may not use it.
	Profile(p auth.Principal, model string) (edgeconfig.Profile, error)
	// Metadata sends one read-only call to every ready Node's online
	// Ollama provider and returns every answer, as gateway.Metadata does.
	Metadata(ctx context.Context, method, path string, maxBody int64) []gateway.MetadataReply
	// StartRun runs req as a normalized run on any provider of model, as
	// gateway.Gateway.StartRun does: for the models no Ollama server
	// serves.
	StartRun(ctx context.Context, p auth.Principal, model string, req *wirepb.RunRequest, admitted func()) (Run, error)
	// Inventory is what p may ask for and can be served now
	// (gateway.Gateway.Inventory).
	Inventory(p auth.Principal) []gateway.Offering
	// Offered is the inventory entry for model, and whether a request for
	// it can be scheduled now.
	Offered(p auth.Principal, model string) (gateway.Offering, bool)
	// Available is nil when a request by p for model can be scheduled
	// now, and otherwise why not, as StartRun would say it (unknown,
	// forbidden, or known but nobody can serve it).
	Available(p auth.Principal, model string) error
}

// Run is a normalized run in progress, as gateway.Run is: Next yields
// events until exactly one terminal, then io.EOF.
type Run interface {
	ID() string
	Next() (*wirepb.RunEvent, error)
	Close()
	Cancel(cause error)
	Context() context.Context
}

// Tunnel is a raw provider request in progress, as gateway.Tunnel is: Head
// is known when StartTunnel returns; Read yields the body until io.EOF (a
// completed terminal) or another error (any other terminal).
type Tunnel interface {
	// ID is the tunnel id, for logs.
	ID() string
	// Head is the provider's response head.
	Head() *wirepb.TunnelResponseHead
	// Read reads the body as the provider flushed it.
	Read(p []byte) (int, error)
	// Ready reports whether Read can return more without waiting: the
	// relay then holds its flush, so that one write to the client carries
	// what arrived together. Called on the goroutine that reads.
	Ready() bool
	// Cancel ends the tunnel with cause; Read then returns its terminal.
	// Safe to call from any goroutine.
	Cancel(cause error)
	// Context is done when the tunnel is cancelled or its deadline
	// passes; its cause says which.
	Context() context.Context
	// Close releases the tunnel, cancelling it if it has not ended. Safe
	// to call more than once.
	Close()
	// CountUsage counts the tokens the answer reported in its final line
	// (metrics by model, principal and Node); called at most once, after
	// Read returned io.EOF.
	CountUsage(prompt, completion int64)
}

// Causes the handler cancels tunnels with; they are also what
// context.Cause reports on the tunnel's context. They are the gateway's
// (the lifecycle is gateway.Exchange's), named here too.
var (
	// ErrClientGone: the client closed the connection or stopped reading.
	ErrClientGone = gateway.ErrClientGone
	// ErrIdleTimeout: nothing went to the client for the profile's
	// idle_timeout.
	ErrIdleTimeout = gateway.ErrIdleTimeout
)

// Route labels of metrics.Requests and metrics.TimeToFirstToken.
const (
	routeChat       = "ollama_chat"
	routeGenerate   = "ollama_generate"
	routeEmbed      = "ollama_embed"
	routeEmbeddings = "ollama_embeddings"
	routeShow       = "ollama_show"
	routeTags       = "ollama_tags"
	routePS         = "ollama_ps"
	routeVersion    = "ollama_version"
)

// endpoint is one path of the API: its method, its metrics route label
// and its handler.
type endpoint struct {
	method string
	route  string
	serve  http.HandlerFunc
}

// Handler serves the Ollama-compatible API; see the package comment for
// its routes. Mount it at "/api/" and at "/{$}". m and log may be nil.
func Handler(r Runner, a *auth.Authenticator, m *metrics.Metrics, log *slog.Logger, door *frontdoor.Door) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if door == nil {
		door = frontdoor.New(frontdoor.Limits{}, nil)
	}
	h := &handler{runner: r, auth: a, metrics: m, log: log, door: door, started: time.Now().UTC()}
	h.endpoints = map[string]endpoint{
		"/api/chat":       {http.MethodPost, routeChat, h.tunnelled(routeChat, false)},
		"/api/generate":   {http.MethodPost, routeGenerate, h.tunnelled(routeGenerate, false)},
		"/api/embed":      {http.MethodPost, routeEmbed, h.tunnelled(routeEmbed, false)},
		"/api/embeddings": {http.MethodPost, routeEmbeddings, h.tunnelled(routeEmbeddings, false)},
		"/api/show":       {http.MethodPost, routeShow, h.tunnelled(routeShow, true)},
		"/api/tags":       {http.MethodGet, routeTags, h.tags},
		"/api/ps":         {http.MethodGet, routePS, h.ps},
		"/api/version":    {http.MethodGet, routeVersion, h.version},
		"/":               {http.MethodGet, "", running},
	}
	return h
}

// handler holds what every request needs.
type handler struct {
	runner    Runner
	auth      *auth.Authenticator
	metrics   *metrics.Metrics
	log       *slog.Logger
	door      *frontdoor.Door
	endpoints map[string]endpoint
	// started is when the handler was made: the modified_at of models
	// whose server does not say.
	started time.Time
}

// ServeHTTP routes by path, then checks the method, so that both mistakes
// are answered in Ollama's error shape rather than as the mux's plain text.
// A GET endpoint answers HEAD too.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ep, ok := h.endpoints[r.URL.Path]
	if !ok {
		writeError(w, &apiError{status: http.StatusNotFound, code: "unknown_url",
			message: "unknown endpoint: " + r.Method + " " + r.URL.Path})
		return
	}
	if r.Method != ep.method && (ep.method != http.MethodGet || r.Method != http.MethodHead) {
		allow := ep.method
		if ep.method == http.MethodGet {
			allow += ", " + http.MethodHead
		}
		w.Header().Set("Allow", allow)
		writeError(w, &apiError{status: http.StatusMethodNotAllowed, code: "method_not_allowed",
			message: "method " + r.Method + " not allowed for " + r.URL.Path + "; use " + ep.method})
		return
	}
	ep.serve(w, r)
}

// running answers Ollama's liveness probe: the ollama CLI sends HEAD /
// before anything else and gives up unless it gets a 200.
func running(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "Ollama is running")
}

// authenticate returns r's principal, or answers 401 and returns false.
func (h *handler) authenticate(w http.ResponseWriter, r *http.Request, route string) (auth.Principal, bool) {
	p, err := h.auth.Authenticate(r)
	if err == nil {
		return p, true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="iop"`)
	writeError(w, &apiError{status: http.StatusUnauthorized, code: "unauthenticated", message: err.Error()})
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
