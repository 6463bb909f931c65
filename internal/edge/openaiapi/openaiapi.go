// Package openaiapi is the Edge's OpenAI-compatible client API:
//
//	POST /v1/chat/completions  a chat run, streamed as server-sent events or
//	                           answered as one chat.completion object (chat.go)
//	POST /v1/responses         a run in OpenAI's Responses API (responses.go)
//	POST /v1/responses/input_tokens
//	                           the token count of a Responses request's input,
//	                           by a provider's tokenizer or estimated (responses.go)
//	POST /v1/completions       a raw text completion run, with suffix for
//	                           fill-in-the-middle (completions.go)
//	POST /v1/embeddings        an embedding call, not a run (embeddings.go)
//	GET  /v1/models            the models the caller may ask for
//	GET  /v1/models/{model}    one of them
//
// It is a translation on the Edge's one front end (internal/edge/frontend),
// which owns each request's life: this package reads OpenAI's wire shapes
// into runs and embedding calls, writes their events back in OpenAI's
// shapes, and words failures as OpenAI does (errors.go):
// {"error":{"message","type","param","code"}}, before the response starts
// as the HTTP status, after it as an SSE error event followed by
// "data: [DONE]": a stream never just stops.
//
// What coding agents and the SDKs send is accepted: a field the Edge does
// not act on is honoured (carried to the provider, mapped to its nearest
// meaning) or ignored on purpose, never a 400 for the request as a whole.
// Namespaces, custom tools and the client-run built-ins become functions
// whose calls answer in the client's terms (tools.go, builtin.go); tools
// only a hosted API runs are dropped and named in X-IOP-Dropped-Tools, or
// refused where the route's profile says so (responses_tools.go); OpenAI's
// reasoning effort levels become the run's (effort.go); and a request's
// session key is read from what the client already sends (session.go).
package openaiapi

import (
	"net/http"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/frontend"
)

// Route labels of metrics and the log.
const (
	routeChat        = "openai_chat"
	routeCompletions = "openai_completions"
	routeResponses   = "openai_responses"
	routeInputTokens = "openai_input_tokens"
	routeEmbeddings  = "openai_embeddings"
	routeModels      = "openai_models"
)

// Handler serves the OpenAI-compatible API on front; see the package
// comment for its routes.
func Handler(front *frontend.Front) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/chat/completions", front.Handler(shape, &frontend.Endpoint{Route: routeChat,
		Log: "openai chat completion", Peek: peekChat, Translate: translateChat}))
	mux.Handle("POST /v1/responses", front.Handler(shape, &frontend.Endpoint{Route: routeResponses,
		Log: "openai response", Peek: peekChat, Translate: translateResponses}))
	mux.Handle("POST /v1/responses/input_tokens", front.Handler(shape, &frontend.Endpoint{Route: routeInputTokens,
		Log: "openai input token count", Peek: peekCount, Translate: translateInputTokens}))
	mux.Handle("POST /v1/completions", front.Handler(shape, &frontend.Endpoint{Route: routeCompletions,
		Log: "openai text completion", Peek: peekChat, Translate: translateCompletion}))
	mux.Handle("POST /v1/embeddings", front.Handler(shape, &frontend.Endpoint{Route: routeEmbeddings,
		Log: "openai embeddings", Peek: peekChat, Translate: translateEmbeddings}))
	d := front.Dispatcher()
	mux.Handle("GET /v1/models", front.Listing(shape, routeModels, func(_ *http.Request, p auth.Principal) (any, *frontend.Failure) {
		list := struct {
			Object string        `json:"object"`
			Data   []modelObject `json:"data"`
		}{Object: "list", Data: []modelObject{}}
		for _, o := range d.Inventory(p) {
			list.Data = append(list.Data, newModelObject(o.ID))
		}
		return list, nil
	}))
	mux.Handle("GET /v1/models/{model...}", front.Listing(shape, routeModels, func(r *http.Request, p auth.Principal) (any, *frontend.Failure) {
		id := r.PathValue("model")
		for _, o := range d.Inventory(p) {
			if o.ID == id {
				return newModelObject(id), nil
			}
		}
		return nil, frontend.ModelNotFound(id)
	}))
	// A known path with another method is 405 with Allow, in OpenAI's
	// shape (the catch-all below would say 404).
	for _, path := range []string{"/v1/chat/completions", "/v1/responses", "/v1/responses/input_tokens", "/v1/completions", "/v1/embeddings"} {
		mux.Handle(path, front.MethodNotAllowed(shape, http.MethodPost))
	}
	mux.Handle("/v1/models", front.MethodNotAllowed(shape, http.MethodGet+", "+http.MethodHead))
	mux.Handle("/v1/models/{model...}", front.MethodNotAllowed(shape, http.MethodGet+", "+http.MethodHead))
	mux.Handle("/v1/", front.Refuse(shape, frontend.UnknownURL))
	return mux
}

// modelObject is one entry of GET /v1/models, in OpenAI's shape.
type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func newModelObject(id string) modelObject {
	return modelObject{ID: id, Object: "model", OwnedBy: "iop"}
}
