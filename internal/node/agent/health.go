package agent

import (
	"cmp"
	"encoding/json"
	"net/http"

	"github.com/iop-dev/iop/internal/node/edgeclient"
)

// HealthHandler serves the Node's own probes, for container health checks
// and orchestrators, and its metrics, for Prometheus:
//
//	GET /healthz  200 while the process runs
//	GET /readyz   200 when ready at one Edge at least, else 503 and why
//	GET /edges    every Edge connection: address, seed or listed, edge id, state,
//	              generation, whether the Edge said it is stopping, last error
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
	mux.HandleFunc("GET /edges", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(edgesView(a.cluster.Edges()))
	})
	return mux
}

// edgeView is one Edge connection as GET /edges shows it.
type edgeView struct {
	Addr       string `json:"addr"`
	Seed       bool   `json:"seed"`
	EdgeID     string `json:"edge_id,omitempty"`
	State      string `json:"state"`
	Generation uint64 `json:"generation,omitempty"`
	Stopping   bool   `json:"stopping,omitempty"`
	// StoppingReason is the reason the Edge gave when it said it stops.
	StoppingReason string `json:"stopping_reason,omitempty"`
	RTTMs          int64  `json:"rtt_ms,omitempty"`
	Connects       int    `json:"connects"`
	LastError      string `json:"last_error,omitempty"`
}

func edgesView(es []edgeclient.EdgeStatus) []edgeView {
	out := make([]edgeView, 0, len(es))
	for _, e := range es {
		v := edgeView{Addr: e.Addr, Seed: e.Seed, EdgeID: cmp.Or(e.EdgeID, e.ListedID), State: string(e.State), Generation: e.Generation,
			Stopping: e.Stopping, StoppingReason: e.StoppingReason, RTTMs: e.LastRTT.Milliseconds(), Connects: e.Connects}
		if e.LastError != nil {
			v.LastError = e.LastError.Error()
		}
		out = append(out, v)
	}
	return out
}

func writeStatus(w http.ResponseWriter, code int, status, reason string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(struct {
		Status string `json:"status"`
		Reason string `json:"reason,omitempty"`
	}{status, reason})
}
