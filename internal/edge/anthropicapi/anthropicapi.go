// Package anthropicapi is the Edge's Anthropic Messages API, so that
// Claude Code and the Anthropic SDKs can use the models of any provider
// (SPEC P2):
//
//	POST /v1/messages        a run, streamed as server-sent events or
//	                         answered as one message object
//	GET  /v1/models          the models the caller may ask for, in
//	GET  /v1/models/{model}  Anthropic's shape (see ModelsOr: the OpenAI API
//	                         has the same paths)
//
// It translates between Anthropic's wire shapes and the normalized run of
// the gateway (wirepb.RunRequest in, wirepb.RunEvent out) and owns nothing
// else, as the OpenAI API does; a request's life (authenticate, read the
// body within its cap, look up the profile, StartRun, relay, end) reads
// top to bottom in messages.go.
//
// The request. system (a string or text blocks), messages (user and
// assistant; text, base64 image, tool_use, tool_result and thinking
// blocks), tools (custom tools only), tool_choice (auto, any → required,
// tool → function:NAME, none), max_tokens (required), stop_sequences,
// temperature, top_p, top_k (in extra_json), thinking (enabled → think
// on, disabled → off, adaptive → the provider's default; the budget has
// no portable meaning) and output_config.format (a JSON schema) become the
// run's. The other fields (metadata, service_tier, cache_control, ...) are
// ignored: they are Anthropic's vocabulary, which no provider behind the
// Edge speaks, so unlike the OpenAI API's they are not passed through.
// Image URLs are refused with 400: the Node may not reach the client's
// network.
//
// The stream, as Anthropic sends it: message_start (the message with empty
// content and the usage known so far), then each content block in order,
// one at a time (content_block_start; content_block_delta with text_delta,
// thinking_delta or input_json_delta; content_block_stop), message_delta
// (stop_reason, and the usage: input_tokens and output_tokens), and
// message_stop. While a request waits in the queue or in a silent prefill,
// a ping event goes out every keepalive_interval of its profile; the first
// commits the response with message_start. An answer that is not streamed
// is one message object with the same blocks. Thinking blocks carry an
// empty signature.
//
// Errors have Anthropic's shape ({"type":"error","error":{"type","message"}}),
// before the response starts as the HTTP status, after it as an `error`
// event, which ends the stream: never a silent end. The type follows the
// status as Anthropic documents it (see errorType): 400
// invalid_request_error, 401 authentication_error, 404 not_found_error
// (also for a model the principal may not use, so that a key does not
// learn which routes exist), 413 request_too_large, 429 rate_limit_error
// with Retry-After, 500 and 502 api_error, 503 overloaded_error (the
// status stays 503), 504 timeout_error; a scheduler refusal's reason is in
// X-IOP-Refusal, as the other APIs send it.
package anthropicapi

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/gateway"
	"github.com/iop-dev/iop/internal/edge/metrics"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Runner is what the handlers need from the gateway; tests fake it.
type Runner interface {
	// StartRun resolves model for p and dispatches req, as
	// gateway.Gateway.StartRun does; admitted, if not nil, is called on
	// the caller's goroutine when the request leaves the queue with its
	// first slot.
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
	// ID is the run id, for logs.
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

// Route labels of metrics.Requests and metrics.TimeToFirstToken, and of
// the log.
const (
	routeMessages = "anthropic_messages"
	routeModels   = "anthropic_models"
)

// VersionHeader is the header every Anthropic client sends, and the one
// ModelsOr tells Anthropic's model list requests by.
const VersionHeader = "anthropic-version"

// Handler serves the Anthropic API; see the package comment for its
// routes. m and log may be nil; door bounds request bodies (nil: a door
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
	mux.HandleFunc("POST /v1/messages", h.messages)
	mux.HandleFunc("GET /v1/models", h.models)
	mux.HandleFunc("GET /v1/models/{model...}", h.model)
	// A known path with another method is 405 with Allow, in Anthropic's
	// shape (the catch-all below would say 404).
	mux.HandleFunc("/v1/messages", methodNotAllowed(http.MethodPost))
	mux.HandleFunc("/v1/models", methodNotAllowed(http.MethodGet+", "+http.MethodHead))
	mux.HandleFunc("/v1/models/{model...}", methodNotAllowed(http.MethodGet+", "+http.MethodHead))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, code: "unknown_url",
			message: "the Edge does not serve " + r.Method + " " + r.URL.Path})
	})
	return mux
}

// ModelsOr sends the requests that carry the anthropic-version header to
// anthropic (the Anthropic API's handler), and the others to other. The
// Anthropic and OpenAI APIs both list models at /v1/models, in different
// shapes; every Anthropic SDK sends the header, and OpenAI's do not.
func ModelsOr(anthropic, other http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(VersionHeader) != "" {
			anthropic.ServeHTTP(w, r)
			return
		}
		other.ServeHTTP(w, r)
	})
}

// methodNotAllowed answers a known path asked with the wrong method.
func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, &apiError{status: http.StatusMethodNotAllowed, code: "method_not_allowed",
			message: "method " + r.Method + " is not allowed for " + r.URL.Path + "; use " + allow})
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
// Anthropic's clients send the key as x-api-key, which auth accepts beside
// Authorization: Bearer.
func (h *handler) authenticate(w http.ResponseWriter, r *http.Request, route string) (auth.Principal, bool) {
	p, err := h.auth.Authenticate(r)
	if err == nil {
		return p, true
	}
	writeError(w, &apiError{status: http.StatusUnauthorized, code: "invalid_api_key", message: err.Error()})
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

// FromGateway adapts g to Runner.
func FromGateway(g *gateway.Gateway) Runner { return gatewayRunner{g} }

type gatewayRunner struct{ g *gateway.Gateway }

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
