package app

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

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

// drainEdge is an Edge's HTTP side, with no listener, for Drain tests.
func drainEdge(t *testing.T) (*Edge, http.Handler) {
	t.Helper()
	cfg := edgeconfig.Default()
	cfg.Listen.HTTP = "127.0.0.1:0"
	log := slog.New(slog.DiscardHandler)
	reg := fleet.New(fleet.Options{GenerationBase: 1})
	s := sched.New(reg, sched.Options{})
	m := edgemetrics.New(reg, s.Depths)
	a, err := auth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runs := inflight.New(inflight.Options{})
	door := frontdoor.New(frontdoor.Limits{}, nil)
	nodes := nodeserver.NewServer(nodeserver.Options{EdgeID: "e"}, reg)
	d := newDispatcher(cfg, s, nodes, m, nil, nil, nil, log)
	front := newFront(d, a, door, m, runs, log)
	h := newHTTPServer(cfg, reg, s, m, door, d, front, a, nil, runs, nil, nil, cluster.NewSingle(cluster.Self{ID: "e"}, reg, cluster.LedgerOptions{}), nil, log)
	h.serving.Store(true)
	return &Edge{http: h, front: front, runs: runs, nodes: nodes, clust: cluster.NewSingle(cluster.Self{ID: "e"}, reg, cluster.LedgerOptions{}), log: log}, h.srv.Handler
}

func get(h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "http://127.0.0.1:8080"+path, strings.NewReader(body))
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// Issue 22, planned stops drain: a stopping Edge answers /readyz 503 (a
// load balancer takes it out) and new requests 503 edge_stopping with
// Retry-After, in each API's shape, and waits for the work in flight to
// end, up to its grace.
func TestAStoppingEdgeWaitsForItsWorkAndTakesNoNew(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, h := drainEdge(t)
		if w := get(h, http.MethodGet, "/readyz", ""); w.Code != http.StatusOK {
			t.Fatalf("/readyz before the stop: %d %s", w.Code, w.Body)
		}
		work := e.runs.Start(inflight.Work{Kind: inflight.Run, ID: "run-1", Model: "m"})
		drained := make(chan time.Time)
		start := time.Now()
		go func() {
			e.Drain(t.Context())
			drained <- time.Now()
		}()
		synctest.Wait()
		if w := get(h, http.MethodGet, "/readyz", ""); w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "stopping") {
			t.Errorf("/readyz while stopping: %d %s, want 503 stopping", w.Code, w.Body)
		}
		if w := get(h, http.MethodGet, "/healthz", ""); w.Code != http.StatusOK {
			t.Errorf("/healthz while stopping: %d, want 200 (the process is alive)", w.Code)
		}
		for _, req := range []struct{ path, body, want string }{
			{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, `"code":"edge_stopping"`},
			{"/api/chat", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, `"error":"this Edge is stopping`},
			{"/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, `"type":"overloaded_error"`},
		} {
			w := get(h, http.MethodPost, req.path, req.body)
			if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" || !strings.Contains(w.Body.String(), req.want) {
				t.Errorf("POST %s while stopping: %d Retry-After %q %s; want 503, Retry-After 1, %s", req.path, w.Code, w.Header().Get("Retry-After"), w.Body, req.want)
			}
		}
		time.Sleep(3 * time.Minute)
		select {
		case <-drained:
			t.Fatal("Drain returned with work in flight")
		default:
		}
		work.End("completed")
		if at := <-drained; at.Sub(start) > 3*time.Minute+time.Second {
			t.Errorf("Drain returned %v after the work ended, want within a poll", at.Sub(start)-3*time.Minute)
		}
	})
}

// The grace bounds the wait.
func TestAStoppingEdgeStopsWaitingAtTheEndOfItsGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _ := drainEdge(t)
		e.runs.Start(inflight.Work{Kind: inflight.Run, ID: "run-1", Model: "m"})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
		defer cancel()
		start := time.Now()
		e.Drain(ctx)
		if took := time.Since(start); took < 10*time.Minute || took > 10*time.Minute+time.Second {
			t.Errorf("Drain took %v, want the 10m grace", took)
		}
	})
}
