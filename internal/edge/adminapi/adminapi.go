// Package adminapi serves the Edge's operational HTTP endpoints: the Node
// list, liveness and readiness, and the credential state with the
// operations that change it (revoke, reload, disable, enable).
//
// The read endpoints (nodes, queues, credentials, and the Edge's /metrics
// through ReadAccess) follow the config's api.admin_reads (Options.OpenReads):
// open to anyone, or only to an admin principal, since they show the fleet
// (Node ids and identities, addresses, labels, versions, providers,
// credential names). /healthz and /readyz are always open, for probes. The
// endpoints that change state always need the API key of a principal with
// admin: true (see credentials.go).
package adminapi

import (
	"encoding/json"
	"log/slog"
	"net/http"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/credentials"
	"github.com/iop-dev/iop/internal/edge/nodes"
)

// Readiness reports whether the Edge can do its job; nil means ready.
type Readiness func() error

// Queues returns the scheduler's queues for the admin view (any JSON
// value).
type Queues func() any

// Options are the optional parts of the admin endpoints.
type Options struct {
	// Queues serves /admin/v1/queues; nil serves an empty list.
	Queues Queues
	// Credentials serves the credential endpoints (credentials.go); nil
	// leaves them answering 404.
	Credentials *credentials.Store
	// Authenticator authenticates the callers of the endpoints that change
	// state, and of the reads unless OpenReads: only a principal with
	// Admin may call them. Nil refuses every such request.
	Authenticator *auth.Authenticator
	// OpenReads serves the read endpoints to anyone; otherwise (the
	// default) only to an admin principal.
	OpenReads bool
	// Logger logs every change made through the admin endpoints, at Warn;
	// nil logs nothing.
	Logger *slog.Logger
}

// newHandler is the handler of opts.
func newHandler(opts Options) *handler {
	h := &handler{creds: opts.Credentials, authn: opts.Authenticator, openReads: opts.OpenReads, log: opts.Logger}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	return h
}

// Handler returns the admin endpoints:
//
//	GET /admin/v1/nodes  every known Node: id, generation, state, last
//	                     heartbeat round trip, providers and their targets
//	GET /healthz         200 while the process serves HTTP
//	GET /readyz          200 when ready() is nil, 503 with the reason otherwise
//	GET /admin/v1/queues the queues: depth, each waiting request's position
//	                     and wait, and the slots in use per candidate
//
// and, with Options.Credentials, the credential endpoints of
// credentials.go. Without it they answer 404.
func Handler(reg *nodes.Registry, ready Readiness, opts Options) http.Handler {
	h := newHandler(opts)
	queues := opts.Queues
	mux := http.NewServeMux()
	h.credentialRoutes(mux)
	mux.HandleFunc("GET /admin/v1/queues", h.read(func(w http.ResponseWriter, r *http.Request) {
		var q any = []any{}
		if queues != nil {
			q = queues()
		}
		writeJSON(w, http.StatusOK, struct {
			Queues any `json:"queues"`
		}{q})
	}))
	mux.HandleFunc("GET /admin/v1/nodes", h.read(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, struct {
			Nodes []nodes.NodeView `json:"nodes"`
		}{reg.Snapshot()})
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, status{Status: "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := ready(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, status{Status: "unavailable", Reason: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, status{Status: "ready"})
	})
	return mux
}

// ReadAccess guards h, another read of the Edge's state (its /metrics), as
// Handler with opts guards its own reads (OpenReads, Authenticator).
func ReadAccess(h http.Handler, opts Options) http.Handler {
	return newHandler(opts).read(h.ServeHTTP)
}

// read serves f to anyone when reads are open, and otherwise only to an
// admin principal (401 or 403 in the shape of the other admin errors).
func (h *handler) read(f http.HandlerFunc) http.HandlerFunc {
	if h.openReads {
		return f
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if _, ok := h.admin(w, r); ok {
			f(w, r)
		}
	}
}

// handler holds what the optional endpoints need.
type handler struct {
	creds     *credentials.Store
	authn     *auth.Authenticator
	log       *slog.Logger
	openReads bool
}

type status struct {
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
