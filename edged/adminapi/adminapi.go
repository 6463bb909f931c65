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

// Handler returns the admin endpoints:
//
//	GET /admin/v1/nodes  every known Node: id, generation, state, last
//	                     heartbeat round trip, providers and their targets
//	GET /healthz         200 while the process serves HTTP
//	GET /readyz          200 when ready() is nil, 503 with the reason otherwise
func Handler(reg *nodes.Registry, ready Readiness) http.Handler {
	mux := http.NewServeMux()
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
