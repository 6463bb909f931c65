package app

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/cluster"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
)

// TestHTTPServerMountsOllamaAPI: the Edge answers the ollama CLI's probe
// at / and serves Ollama's API under /api/, beside the other handlers.
func TestHTTPServerMountsOllamaAPI(t *testing.T) {
	cfg := edgeconfig.Default()
	cfg.Listen.HTTP = "127.0.0.1:0" // loopback without keys: anonymous
	log := slog.New(slog.DiscardHandler)
	reg := fleet.New(fleet.Options{GenerationBase: 1})
	s := sched.New(reg, sched.Options{})
	m := edgemetrics.New(reg, s.Depths)
	a, err := auth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	door := frontdoor.New(frontdoor.Limits{}, nil)
	d := newDispatcher(cfg, s, nodeserver.NewServer(nodeserver.Options{EdgeID: "e"}, reg), m, nil, nil, nil, log)
	h := newHTTPServer(cfg, reg, s, m, door, d, newFront(d, a, door, m, inflight.New(inflight.Options{}), log), a, nil, inflight.New(inflight.Options{}), nil, nil, cluster.NewSingle(cluster.Self{ID: "e"}, reg, cluster.LedgerOptions{}), nil, log).srv.Handler
	tests := []struct {
		method, path string
		status       int
		body         string
	}{
		{http.MethodHead, "/", 200, ""},
		{http.MethodGet, "/", 200, "Ollama is running"},
		{http.MethodGet, "/api/tags", 200, `{"models":[]}`},
		{http.MethodGet, "/api/version", 503, `{"error":"no Ollama provider is connected"}`},
		{http.MethodGet, "/v1/models", 200, ""},
		{http.MethodGet, "/healthz", 200, ""},
	}
	for _, tt := range tests {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(tt.method, "http://127.0.0.1:8080"+tt.path, nil))
		if w.Code != tt.status || (tt.body != "" && w.Body.String() != tt.body) {
			t.Errorf("%s %s: %d %q", tt.method, tt.path, w.Code, w.Body)
		}
	}
}
