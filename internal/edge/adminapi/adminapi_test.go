package adminapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/edge/adminapi"
	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// rttLink is a Node connection whose last heartbeat round trip took rtt
// and ended at at. It opens no streams and closes nothing.
type rttLink struct {
	rtt time.Duration
	at  time.Time
}

func (l rttLink) RTT() (time.Duration, time.Time) { return l.rtt, l.at }
func (rttLink) Close(quicwire.CloseCode, string)  {}
func (rttLink) OpenStream(context.Context, time.Duration) (*quic.Stream, error) {
	return nil, errors.New("rttLink opens no streams")
}

func get(t *testing.T, h http.Handler, path string) (*httptest.ResponseRecorder, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("GET %s: body is not JSON: %v\n%s", path, err, rec.Body)
	}
	return rec, body
}

func TestNodesListsStateGenerationRTTAndProviders(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	reg := fleet.New(fleet.Options{GenerationBase: 100, Now: func() time.Time { return now }})
	c := reg.Register(fleet.ConnInfo{
		NodeID: "n1", Identity: "loopback", Version: "1.2.3",
		Providers: []*wirepb.Provider{{Name: "ollama", Adapter: "ollama", Capacity: 2, State: wirepb.ProviderState_PROVIDER_STATE_ONLINE,
			Targets: []*wirepb.Target{{Name: "llama3.2"}, {Name: "qwen3"}}}},
		Link: rttLink{1500 * time.Microsecond, now},
	})
	if err := reg.MarkReady(c, c.Generation(), nil); err != nil {
		t.Fatal(err)
	}
	old := reg.Register(fleet.ConnInfo{NodeID: "n2", Providers: []*wirepb.Provider{{Name: "sim", State: wirepb.ProviderState_PROVIDER_STATE_ONLINE}}})
	reg.Fence(old, quicwire.CloseHeartbeatTimeout, "no answer")

	rec, body := get(t, adminapi.Handler(reg, func() error { return nil }, adminapi.Options{OpenReads: true}), "/admin/v1/nodes")
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	list := body["nodes"].([]any)
	if len(list) != 2 {
		t.Fatalf("got %d nodes, want 2: %v", len(list), body)
	}
	n1, n2 := list[0].(map[string]any), list[1].(map[string]any)
	if n1["id"] != "n1" || n1["state"] != "ready" || n1["generation"] != float64(101) || n1["last_heartbeat_rtt_ms"] != 1.5 {
		t.Errorf("n1 = %v", n1)
	}
	p := n1["providers"].([]any)[0].(map[string]any)
	if p["name"] != "ollama" || p["state"] != "online" || len(p["targets"].([]any)) != 2 {
		t.Errorf("n1 provider = %v", p)
	}
	if n2["state"] != "fenced" || n2["fence_reason"] != "heartbeat_timeout" {
		t.Errorf("n2 = %v", n2)
	}
	if p := n2["providers"].([]any)[0].(map[string]any); p["state"] != "offline" {
		t.Errorf("a fenced node's provider is %v, want offline (R9)", p["state"])
	}
}

func TestReadyzSaysWhyNotReady(t *testing.T) {
	reg := fleet.New(fleet.Options{})
	ready := errors.New("quic listener not started")
	h := adminapi.Handler(reg, func() error { return ready }, adminapi.Options{})
	rec, body := get(t, h, "/readyz")
	if rec.Code != http.StatusServiceUnavailable || body["reason"] != ready.Error() {
		t.Errorf("readyz = %d %v", rec.Code, body)
	}
	ready = nil
	if rec, _ := get(t, h, "/readyz"); rec.Code != http.StatusOK {
		t.Errorf("readyz when ready = %d", rec.Code)
	}
	if rec, _ := get(t, h, "/healthz"); rec.Code != http.StatusOK {
		t.Errorf("healthz = %d", rec.Code)
	}
}

func TestQueuesAreListed(t *testing.T) {
	h := adminapi.Handler(fleet.New(fleet.Options{}), func() error { return nil }, adminapi.Options{OpenReads: true, Queues: func() any {
		return []map[string]any{{"model": "m", "depth": 2}}
	}})
	rec, body := get(t, h, "/admin/v1/queues")
	q := body["queues"].([]any)
	if rec.Code != http.StatusOK || len(q) != 1 || q[0].(map[string]any)["depth"] != float64(2) {
		t.Errorf("queues = %d %v", rec.Code, body)
	}
}

// Issue 10 item 7: unless admin_reads is open, the reads that show the
// fleet (nodes, queues, credentials, and /metrics through ReadAccess)
// answer only an admin principal: 401 without a key, 403 for a key that is
// not an admin's or for the anonymous principal. Health probes stay open.
func TestReadsNeedAnAdminUnlessOpen(t *testing.T) {
	cfg := edgeconfig.Default()
	cfg.Principals = []edgeconfig.Principal{{Name: "ops", Routes: []string{"*"}, Admin: true}, {Name: "app", Routes: []string{"*"}}}
	cfg.API.Keys = []edgeconfig.APIKey{{Principal: "ops", SHA256: auth.HashKey("ops-key")}, {Principal: "app", SHA256: auth.HashKey("app-key")}}
	authn, err := auth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	metricsRead := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("iop_edge_requests_total 1\n")) })
	for _, open := range []bool{false, true} {
		opts := adminapi.Options{Authenticator: authn, OpenReads: open, Runs: inflight.New(inflight.Options{})}
		h := adminapi.Handler(fleet.New(fleet.Options{}), func() error { return nil }, opts)
		mux := http.NewServeMux()
		mux.Handle("/admin/", h)
		mux.Handle("/healthz", h)
		mux.Handle("/metrics", adminapi.ReadAccess(metricsRead, opts))
		for _, path := range []string{"/admin/v1/nodes", "/admin/v1/queues", "/admin/v1/runs", "/metrics"} {
			for _, c := range []struct {
				key  string
				want int
			}{{"", http.StatusUnauthorized}, {"app-key", http.StatusForbidden}, {"ops-key", http.StatusOK}} {
				want := c.want
				if open {
					want = http.StatusOK
				}
				r := httptest.NewRequest(http.MethodGet, path, nil)
				if c.key != "" {
					r.Header.Set("Authorization", "Bearer "+c.key)
				}
				rec := httptest.NewRecorder()
				mux.ServeHTTP(rec, r)
				if rec.Code != want {
					t.Errorf("open=%v GET %s with key %q = %d, want %d: %s", open, path, c.key, rec.Code, want, rec.Body)
				}
				if rec.Code != http.StatusOK && strings.Contains(rec.Body.String(), "iop_edge") {
					t.Errorf("a refused read leaked the metrics")
				}
			}
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		if rec.Code != http.StatusOK {
			t.Errorf("open=%v: /healthz without a key = %d, want 200", open, rec.Code)
		}
	}
}
