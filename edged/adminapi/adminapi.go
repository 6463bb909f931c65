// Package adminapi serves the Edge's operational HTTP endpoints: the Node
// list, liveness and readiness, and the credential state with the
// operations that change it (revoke, reload, disable, enable).
//
// The read-only endpoints need no key, as before. The endpoints that change
// state need the API key of a principal with admin: true (see
// credentials.go).
package adminapi

import (
	"encoding/json"
	"log/slog"
	"net/http"

	"github.com/iop-dev/iop/edged/auth"
	"github.com/iop-dev/iop/edged/credentials"
	"github.com/iop-dev/iop/edged/nodes"
)

// Readiness reports whether the Edge can do its job; nil means ready.
type Readiness func() error

// Queues returns the scheduler's queues for the admin view (any JSON
// value); nil serves an empty list.
type Queues func() any

// Handler returns the admin endpoints:
//
//	GET /admin/v1/nodes  every known Node: id, generation, state, last
//	                     heartbeat round trip, providers and their targets
//	GET /healthz         200 while the process serves HTTP
//	GET /readyz          200 when ready() is nil, 503 with the reason otherwise
//	GET /admin/v1/queues the queues: depth, each waiting request's position
//	                     and wait, and the slots in use per candidate
//
// and, with WithCredentials, the credential endpoints of credentials.go.
// Without it they answer 404.
func Handler(reg *nodes.Registry, ready Readiness, queues Queues, opts ...Option) http.Handler {
	h := &handler{log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(h)
	}
	mux := http.NewServeMux()
	h.credentialRoutes(mux)
	mux.HandleFunc("GET /admin/v1/queues", func(w http.ResponseWriter, r *http.Request) {
		var q any = []any{}
		if queues != nil {
			q = queues()
		}
		writeJSON(w, http.StatusOK, struct {
			Queues any `json:"queues"`
		}{q})
	})
	mux.HandleFunc("GET /admin/v1/nodes", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, struct {
			Nodes []nodes.NodeView `json:"nodes"`
		}{reg.Snapshot()})
	})
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

// Option configures an optional part of Handler.
type Option func(*handler)

// WithCredentials serves the credential endpoints over store; a nil store
// leaves them answering 404.
func WithCredentials(store *credentials.Store) Option {
	return func(h *handler) { h.creds = store }
}

// WithAuthenticator authenticates the callers of the endpoints that change
// state: only a principal with Admin may call them. Without it those
// endpoints refuse every request.
func WithAuthenticator(a *auth.Authenticator) Option {
	return func(h *handler) { h.authn = a }
}

// WithLogger logs every change made through the admin endpoints, at Warn;
// without it nothing is logged.
func WithLogger(log *slog.Logger) Option {
	return func(h *handler) {
		if log != nil {
			h.log = log
		}
	}
}

// handler holds what the optional endpoints need.
type handler struct {
	creds *credentials.Store
	authn *auth.Authenticator
	log   *slog.Logger
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
