// Package anthropicapi is the Edge's Anthropic Messages API, so that
// Claude Code and the Anthropic SDKs can use the models of any provider
// (SPEC P2):
//
//	POST /v1/messages               a run, streamed as server-sent events or
//	                                answered as one message object
//	POST /v1/messages/count_tokens  the tokens of a Messages request's prompt:
//	                                {"input_tokens": N}, exact where a candidate
//	                                tokenizes, else estimated (X-IOP-Token-Count)
//	GET  /v1/models                 the models the caller may ask for, in
//	GET  /v1/models/{model}         Anthropic's shape (see ModelsOr: the OpenAI
//	                                API has the same paths)
//
// It is a translation on the Edge's one front end (internal/edge/frontend),
// which owns each request's life, as the OpenAI API is: Anthropic's wire
// shapes in, the normalized run (wirepb.RunRequest in, wirepb.RunEvent
// out), Anthropic's shapes back. A query string (Claude Code's ?beta=true)
// does not change the route.
//
// The request: what is honoured.
//
//   - system (a string or text blocks) is the first system message;
//     messages are user, assistant and system turns: a system turn inside
//     the conversation (Claude Code's environment block) is a system message
//     where it stands (the adapters fold it into a user turn there for
//     servers whose chat templates refuse one), and its tool_addition and
//     tool_removal blocks (Anthropic's mid-conversation tool changes) make
//     the run's tools the set in effect at the conversation's end.
//   - Content (content.go): text, base64 image, tool_use, tool_result and
//     thinking blocks (redacted_thinking, encrypted for Anthropic's models,
//     is dropped); documents of text (source text, content, or base64
//     text/*) and search_result blocks, in a user turn or a tool's result,
//     as text between <document> or <search_result> tags with their title,
//     context and source; tool_reference (a tool search's result) as a line
//     saying the tool is available. What the model behind the Edge cannot
//     have, a PDF document, or a document or image at a URL or in
//     Anthropic's Files API, is a short placeholder the model reads, saying
//     what was left out and why, and the request runs.
//   - tools: custom tools as they are; Anthropic's client tools (bash,
//     text_editor, memory, computer: the client runs them, Anthropic keeps
//     their schemas in its models) as functions of the names the client
//     runs, with the schema their calls have; server tools (web_search,
//     web_fetch, code_execution, tool_search, advisor, mcp_toolset), the
//     client toolsets and tool types this package does not know, and
//     mcp_servers, are hosted tools: dropped and named in
//     X-IOP-Dropped-Tools, or refused with 400 where the route's profile
//     says hosted_tools: refuse (see tools.go).
//   - tool_choice (auto, any → required, tool → function:NAME, none),
//     max_tokens (required, but not by count_tokens), stop_sequences,
//     temperature, top_p, top_k (in extra_json), output_config.format (a
//     JSON schema).
//   - thinking and output_config.effort become the run's think and
//     reasoning_effort: enabled → on, its budget_tokens mapped to a level;
//     adaptive and between_tools → on, the model's default effort;
//     disabled → off (effort none); output_config.effort low, medium, high
//     as they are, xhigh and max as max, and over a budget (thinking.go).
//     An unknown thinking type or effort is 400.
//   - the session a request is a turn of, for affinity: the
//     X-Claude-Code-Session-Id header, else metadata.user_id (its
//     session_id when it is Claude Code's JSON).
//
// What is ignored on purpose: cache_control on any block, tool or the
// request (providers cache prompt prefixes by themselves), thinking's
// display, a document's citations (only Anthropic's models make them), a
// system turn's output_config, metadata beyond the session,
// context_management (Anthropic's server-side clearing of old context: the
// client's conversation is run as sent), service_tier, container, speed, inference_geo, the anthropic-beta
// header, defer_loading (a deferred tool is offered as any other) and any
// field or header this package does not know. They are Anthropic's own
// vocabulary, which no provider behind the Edge speaks, so unlike the
// OpenAI API's unknown fields they are not passed through.
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
	"net/http"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/frontend"
)

// Route labels of metrics and the log.
const (
	routeMessages = "anthropic_messages"
	routeCount    = "anthropic_count_tokens"
	routeModels   = "anthropic_models"
)

// VersionHeader is the header every Anthropic client sends, and the one
// ModelsOr tells Anthropic's model list requests by.
const VersionHeader = "anthropic-version"

// Handler serves the Anthropic API on front; see the package comment for
// its routes.
func Handler(front *frontend.Front) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/messages", front.Handler(shape, &frontend.Endpoint{Route: routeMessages,
		Log: "anthropic message", Peek: peekMessages, Translate: translateMessages}))
	mux.Handle("POST /v1/messages/count_tokens", front.Handler(shape, &frontend.Endpoint{Route: routeCount,
		Log: "anthropic token count", Peek: peekCount, Translate: translateCount}))
	d := front.Dispatcher()
	mux.Handle("GET /v1/models", front.Listing(shape, routeModels, func(r *http.Request, p auth.Principal) (any, *frontend.Failure) {
		return modelsPage(r, d.Inventory(p))
	}))
	mux.Handle("GET /v1/models/{model...}", front.Listing(shape, routeModels, func(r *http.Request, p auth.Principal) (any, *frontend.Failure) {
		id := r.PathValue("model")
		for _, o := range d.Inventory(p) {
			if o.ID == id {
				return newModelInfo(id), nil
			}
		}
		return nil, frontend.ModelNotFound(id)
	}))
	// A known path with another method is 405 with Allow, in Anthropic's
	// shape (the catch-all below would say 404).
	mux.Handle("/v1/messages", front.MethodNotAllowed(shape, http.MethodPost))
	mux.Handle("/v1/messages/count_tokens", front.MethodNotAllowed(shape, http.MethodPost))
	mux.Handle("/v1/models", front.MethodNotAllowed(shape, http.MethodGet+", "+http.MethodHead))
	mux.Handle("/v1/models/{model...}", front.MethodNotAllowed(shape, http.MethodGet+", "+http.MethodHead))
	mux.Handle("/", front.Refuse(shape, frontend.UnknownURL))
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
