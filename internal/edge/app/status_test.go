package app

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
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

// The status page is served on the client listener at /status to anyone
// (it holds no data), beside Ollama's root; its data, the admin reads, keep
// api.admin_reads' guard: open on an anonymous loopback Edge, an admin's
// key otherwise.
func TestStatusPageIsServedAndItsDataAreGuardedLikeTheAdminReads(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		cfg := edgeconfig.Default()
		cfg.Listen.HTTP = "127.0.0.1:0"
		if keyed {
			cfg.Principals = []edgeconfig.Principal{{Name: "ops", Routes: []string{"*"}, Admin: true}}
			cfg.API.Keys = []edgeconfig.APIKey{{Principal: "ops", SHA256: auth.HashKey("ops-key")}}
		}
		log := slog.New(slog.DiscardHandler)
		reg := fleet.New(fleet.Options{GenerationBase: 1})
		s := sched.New(reg, sched.Options{})
		m := edgemetrics.New(reg, s.Depths)
		a, err := auth.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		runs := inflight.New(inflight.Options{})
		runs.Start(inflight.Work{Kind: inflight.Run, ID: "run-1", Model: "m"})
		door := frontdoor.New(frontdoor.Limits{}, nil)
		d := newDispatcher(cfg, s, nodeserver.NewServer(nodeserver.Options{EdgeID: "e"}, reg), m, nil, nil, nil, log)
		h := newHTTPServer(cfg, reg, s, m, door, d, newFront(d, a, door, m, runs, log), a, nil, runs, nil, nil, cluster.NewSingle(cluster.Self{ID: "e"}, reg, cluster.LedgerOptions{}), nil, log).srv.Handler
		do := func(path, key string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:8080"+path, nil)
			if key != "" {
				r.Header.Set("Authorization", "Bearer "+key)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		for _, path := range []string{"/status", "/status/app.js", "/status/style.css"} {
			if w := do(path, ""); w.Code != http.StatusOK {
				t.Errorf("keyed=%v: GET %s without a key = %d, want 200", keyed, path, w.Code)
			}
		}
		if w := do("/", ""); w.Body.String() != "Ollama is running" {
			t.Errorf("keyed=%v: GET / = %q, want Ollama's root", keyed, w.Body)
		}
		want := http.StatusOK
		if keyed {
			want = http.StatusUnauthorized
		}
		for _, path := range []string{"/admin/v1/runs", "/admin/v1/nodes", "/admin/v1/queues"} {
			if w := do(path, ""); w.Code != want {
				t.Errorf("keyed=%v: GET %s without a key = %d, want %d", keyed, path, w.Code, want)
			}
		}
		if keyed {
			if w := do("/admin/v1/runs", "ops-key"); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"run-1"`) {
				t.Errorf("GET /admin/v1/runs with the admin key = %d %s", w.Code, w.Body)
			}
		}
	}
}
