// Package adminapi serves the Edge's operational HTTP endpoints: the Node
// list, liveness and readiness.
package adminapi

import (
	"encoding/json"
	"net/http"

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
func Handler(reg *nodes.Registry, ready Readiness, queues Queues) http.Handler {
	mux := http.NewServeMux()
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
