package adminapi_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/iop-dev/iop/internal/edge/adminapi"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// What the status page reads beyond the registry: each provider's slots
// in use (the scheduler's, joined by Node generation and provider).
func TestNodesShowEachProvidersSlotsInUse(t *testing.T) {
	reg := fleet.New(fleet.Options{GenerationBase: 100})
	c := reg.Register(fleet.ConnInfo{NodeID: "n1", Providers: []*wirepb.Provider{
		{Name: "ollama", Adapter: "ollama", Capacity: 4, State: wirepb.ProviderState_PROVIDER_STATE_ONLINE, Targets: []*wirepb.Target{{Name: "m"}}},
		{Name: "sim", Adapter: "simulator", Capacity: 2, State: wirepb.ProviderState_PROVIDER_STATE_ONLINE},
	}})
	if err := reg.MarkReady(c, c.Generation(), nil); err != nil {
		t.Fatal(err)
	}
	load := func() []sched.LoadView {
		return []sched.LoadView{
			{NodeID: "n1", Generation: c.Generation(), Provider: "ollama", Capacity: 4, InFlight: 3, Candidate: true},
			// Slots still held on an older generation count for nothing here.
			{NodeID: "n1", Generation: c.Generation() - 1, Provider: "sim", InFlight: 1},
		}
	}
	_, body := get(t, adminapi.Handler(reg, func() error { return nil }, adminapi.Options{OpenReads: true, Load: load}), "/admin/v1/nodes")
	ps := body["nodes"].([]any)[0].(map[string]any)["providers"].([]any)
	if len(ps) != 2 {
		t.Fatalf("providers = %v", ps)
	}
	ollama, sim := ps[0].(map[string]any), ps[1].(map[string]any)
	if ollama["name"] != "ollama" || ollama["in_flight"] != float64(3) || ollama["capacity"] != float64(4) || ollama["adapter"] != "ollama" {
		t.Errorf("ollama = %v, want 3 of 4 in flight", ollama)
	}
	if sim["name"] != "sim" || sim["in_flight"] != float64(0) {
		t.Errorf("sim = %v, want 0 in flight (the held slot is another generation's)", sim)
	}
}

func TestQueuesShowTheModelsWhenGiven(t *testing.T) {
	reg := fleet.New(fleet.Options{})
	models := func() any {
		return []sched.ModelView{{Model: "m", Capacity: 4, Free: 1, QueueDepth: 2, OldestWaitMillis: 1500}}
	}
	_, body := get(t, adminapi.Handler(reg, func() error { return nil }, adminapi.Options{OpenReads: true, Models: models}), "/admin/v1/queues")
	ms, ok := body["models"].([]any)
	if !ok || len(ms) != 1 {
		t.Fatalf("queues without models: %v", body)
	}
	if m := ms[0].(map[string]any); m["model"] != "m" || m["free"] != float64(1) || m["queue_depth"] != float64(2) || m["oldest_wait_ms"] != 1500.0 {
		t.Errorf("model = %v", m)
	}
	_, body = get(t, adminapi.Handler(reg, func() error { return nil }, adminapi.Options{OpenReads: true}), "/admin/v1/queues")
	if _, ok := body["models"]; ok {
		t.Errorf("models without Options.Models: %v", body)
	}
	if _, ok := body["sessions"]; ok {
		t.Errorf("sessions without Options.Sessions: %v", body)
	}
}

// Issue 21: the session affinity table is on the queues read, for the
// status page's tile.
func TestQueuesShowTheSessionsWhenGiven(t *testing.T) {
	reg := fleet.New(fleet.Options{})
	sessions := func() any {
		return dispatch.SessionStats{Sessions: 3, Turns: map[string]uint64{dispatch.TurnStuck: 20, dispatch.TurnMovedBusy: 2}}
	}
	_, body := get(t, adminapi.Handler(reg, func() error { return nil }, adminapi.Options{OpenReads: true, Sessions: sessions}), "/admin/v1/queues")
	s, ok := body["sessions"].(map[string]any)
	if !ok || s["sessions"] != float64(3) {
		t.Fatalf("sessions = %v", body["sessions"])
	}
	if turns := s["turns"].(map[string]any); turns["stuck"] != float64(20) || turns["moved_busy"] != float64(2) {
		t.Errorf("turns = %v", turns)
	}
}

func TestRunsShowTheWorkInFlightAndHowRecentWorkEnded(t *testing.T) {
	tr := inflight.New(inflight.Options{})
	e := tr.Start(inflight.Work{Kind: inflight.Run, ID: "run-1", API: "openai_chat", Model: "m", Principal: "alice"})
	e.Dispatched("n1", "ollama", "m:latest")
	tr.Start(inflight.Work{Kind: inflight.Tunnel, ID: "tun-1", Model: "m"}).End("lease_rejected")
	h := adminapi.Handler(fleet.New(fleet.Options{}), func() error { return nil }, adminapi.Options{OpenReads: true, Runs: tr})

	rec, body := get(t, h, "/admin/v1/runs")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /admin/v1/runs = %d", rec.Code)
	}
	lv := body["live"].([]any)
	if len(lv) != 1 {
		t.Fatalf("live = %v, want run-1", lv)
	}
	if r := lv[0].(map[string]any); r["id"] != "run-1" || r["phase"] != "prefill" || r["node"] != "n1" || r["api"] != "openai_chat" || r["principal"] != "alice" {
		t.Errorf("run-1 = %v, want in prefill on n1", r)
	}
	recent := body["recent"].([]any)
	if len(recent) != 1 || recent[0].(map[string]any)["reason"] != "lease_rejected" {
		t.Errorf("recent = %v, want tun-1 lease_rejected", recent)
	}
	if totals := body["terminals"].(map[string]any)["totals"].(map[string]any); totals["lease_rejected"] != float64(1) {
		t.Errorf("totals = %v", totals)
	}

	without := adminapi.Handler(fleet.New(fleet.Options{}), func() error { return nil }, adminapi.Options{OpenReads: true})
	rec = httptest.NewRecorder()
	without.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/v1/runs", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("runs without a tracker = %d, want 404", rec.Code)
	}
}
