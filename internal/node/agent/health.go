package agent

import (
	"encoding/json"
	"net/http"
)

// HealthHandler serves the Node's own probes, for container health checks
// and orchestrators, and its metrics, for Prometheus:
//
//	GET /healthz  200 while the process runs
//	GET /readyz   200 when registered and ready at the Edge, else 503 and why
//	GET /metrics  the Node's metrics (nodemetrics)
func (a *Agent) HealthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", a.metrics.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeStatus(w, http.StatusOK, "ok", "")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := a.Ready(); err != nil {
			writeStatus(w, http.StatusServiceUnavailable, "unavailable", err.Error())
			return
		}
		writeStatus(w, http.StatusOK, "ready", "")
	})
	return mux
}

func writeStatus(w http.ResponseWriter, code int, status, reason string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(struct {
		Status string `json:"status"`
		Reason string `json:"reason,omitempty"`
	}{status, reason})
}
