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
//	POST /api/pull, /api/copy,       model management on the fleet, for
//	     /api/create; DELETE          admin principals (manage.go)
//	     /api/delete
//	GET  /  (and HEAD /)             "Ollama is running", as Ollama answers
//	                                 the CLI's probe; no key needed
//
// It is a translation on the Edge's one front end (internal/edge/frontend),
// which owns each request's life. A model one of whose candidates is an
// Ollama server is relayed to it as is (tunnel.go): the provider's own
// request and answer pass through, minus the client's key to the Edge and
// the server's policy: of the answer's headers only content ones pass, and
// only Ollama's content types (headers.go). One name is changed: through an alias route
// (the client's model name is not the chosen target's) the provider is
// asked for the target, and the answer gives the client its own name back
// (alias.go). Any other model is served from the one normalized run
// (run.go), an embedding call (embed.go) or what the Edge knows (show),
// written in Ollama's shapes.
//
// What the package adds to a relayed answer is the failure handling
// Ollama's clients need. Every error has Ollama's shape, {"error":"..."}:
// before output as an HTTP status, after it as one more NDJSON line. The
// official Ollama Go client treats a stream that just stops as a success,
// so a tunnel that ends with anything but a completed terminal after
// output started always gets that line, and so does a completed chat or
// generate stream without its done line (ending.go): never a silent end.
// Unknown /api/ paths are 404 and a wrong method 405, both in the same
// shape.
package ollamaapi

import (
	"io"
	"net/http"
	"time"

	"github.com/iop-dev/iop/internal/edge/frontend"
)

// Adapter is the provider adapter whose servers this API's raw tunnel
// relays to: a Node's Ollama providers.
const Adapter = "ollama"

// Route labels of metrics and the log.
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

// shape is how the Ollama API answers with JSON and failures:
// {"error":"..."}.
var shape = &frontend.API{
	ErrorBody:   func(f *frontend.Failure) any { return errorOf(f) },
	Challenge:   `Bearer realm="iop"`,
	ContentType: "application/json; charset=utf-8",
}

// endpoint is one path of the API: its method and its handler.
type endpoint struct {
	method string
	serve  http.Handler
}

// Handler serves the Ollama-compatible API on front; see the package
// comment for its routes. Mount it at "/api/" and at "/{$}".
func Handler(front *frontend.Front, opts ...Option) http.Handler {
	h := &handler{front: front, d: front.Dispatcher(), started: time.Now().UTC()}
	for _, o := range opts {
		o(h)
	}
	// A body may be as large as the Edge's request limit (the endpoint's
	// MaxBody left 0): a tunnel holds it in memory, as the dispatcher may
	// send it to a second candidate, and how many are held at once is the
	// front door's body memory to bound (P3).
	model := func(route, log string, nameToo bool) http.Handler {
		return front.Handler(shape, &frontend.Endpoint{Route: route, Log: log,
			Peek: peekModel(nameToo), Translate: h.translate(route)})
	}
	h.endpoints = map[string]endpoint{
		"/api/chat":       {http.MethodPost, model(routeChat, "ollama chat", false)},
		"/api/generate":   {http.MethodPost, model(routeGenerate, "ollama generate", false)},
		"/api/embed":      {http.MethodPost, model(routeEmbed, "ollama embed", false)},
		"/api/embeddings": {http.MethodPost, model(routeEmbeddings, "ollama embeddings", false)},
		"/api/show":       {http.MethodPost, model(routeShow, "ollama show", true)},
		"/api/tags":       {http.MethodGet, front.Listing(shape, routeTags, h.listing("/api/tags", false))},
		"/api/ps":         {http.MethodGet, front.Listing(shape, routePS, h.listing("/api/ps", true))},
		"/api/version":    {http.MethodGet, front.Listing(shape, routeVersion, h.version)},
		"/api/pull":       {http.MethodPost, h.manage(opPull)}, // model management: manage.go
		"/api/delete":     {http.MethodDelete, h.manage(opDelete)},
		"/api/copy":       {http.MethodPost, h.manage(opCopy)},
		"/api/create":     {http.MethodPost, h.manage(opCreate)},
		"/":               {http.MethodGet, http.HandlerFunc(running)},
	}
	return h
}

// handler routes the API's paths.
type handler struct {
	front     *frontend.Front
	d         frontend.Dispatcher
	endpoints map[string]endpoint
	// started is when the handler was made: the modified_at of models
	// whose server does not say.
	started time.Time
	// manager serves model management (WithManagement); nil: not served.
	manager *Management
}

// ServeHTTP routes by path, then checks the method, so that both mistakes
// are answered in Ollama's error shape rather than as the mux's plain text.
// A GET endpoint answers HEAD too.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ep, ok := h.endpoints[r.URL.Path]
	if !ok {
		h.front.Refuse(shape, frontend.UnknownURL).ServeHTTP(w, r)
		return
	}
	if r.Method != ep.method && (ep.method != http.MethodGet || r.Method != http.MethodHead) {
		allow := ep.method
		if ep.method == http.MethodGet {
			allow += ", " + http.MethodHead
		}
		h.front.MethodNotAllowed(shape, allow).ServeHTTP(w, r)
		return
	}
	ep.serve.ServeHTTP(w, r)
}

// running answers Ollama's liveness probe: the ollama CLI sends HEAD /
// before anything else and gives up unless it gets a 200.
func running(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "Ollama is running")
}
