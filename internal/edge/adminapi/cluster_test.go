package adminapi_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/adminapi"
	"github.com/iop-dev/iop/internal/edge/cluster"
	"github.com/iop-dev/iop/internal/edge/fleet"
)

// Issue 22: an Edge alone shows the cluster view too: itself, alive, from
// memory, and for each of its Nodes its own connection.
func TestTheClusterViewOfAnEdgeAlone(t *testing.T) {
	reg := fleet.New(fleet.Options{})
	c := reg.Register(fleet.ConnInfo{NodeID: "n1"})
	if err := reg.MarkReady(c, c.Generation(), nil); err != nil {
		t.Fatal(err)
	}
	solo := cluster.NewSingle(cluster.Self{ID: "edge-1", QUICAddr: "10.0.0.1:7443", HTTPAddr: "10.0.0.1:8080", Version: "1.0"}, reg, cluster.LedgerOptions{})
	h := adminapi.Handler(reg, func() error { return nil }, adminapi.Options{OpenReads: true, Cluster: solo})
	rec, body := get(t, h, "/admin/v1/cluster")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /admin/v1/cluster = %d %v", rec.Code, body)
	}
	edges := body["edges"].([]any)
	if len(edges) != 1 || body["self"] != "edge-1" || body["clustered"] != false || body["config_agreed"] != true {
		t.Fatalf("view %v", body)
	}
	e := edges[0].(map[string]any)
	if e["id"] != "edge-1" || e["alive"] != true || e["quic_address"] != "10.0.0.1:7443" || e["nodes"] != float64(1) {
		t.Errorf("edge %v", e)
	}
	nodes := body["nodes"].([]any)
	if len(nodes) != 1 {
		t.Fatalf("nodes %v", nodes)
	}
	n := nodes[0].(map[string]any)
	link := n["edges"].([]any)[0].(map[string]any)
	if n["id"] != "n1" || link["edge"] != "edge-1" || link["state"] != "ready" || link["generation"] != float64(c.Generation()) {
		t.Errorf("node %v", n)
	}
}

// The cluster and usage reads are reads like the others: not open, they
// need an admin.
func TestTheClusterReadsAreGuardedLikeTheOthers(t *testing.T) {
	reg := fleet.New(fleet.Options{})
	solo := cluster.NewSingle(cluster.Self{ID: "edge-1"}, reg, cluster.LedgerOptions{})
	h := adminapi.Handler(reg, func() error { return nil }, adminapi.Options{Cluster: solo})
	for _, path := range []string{"/admin/v1/cluster", "/admin/v1/usage"} {
		if rec, body := get(t, h, path); rec.Code != http.StatusForbidden {
			t.Errorf("GET %s without an admin = %d %v, want 403", path, rec.Code, body)
		}
	}
	h = adminapi.Handler(reg, func() error { return nil }, adminapi.Options{OpenReads: true})
	for _, path := range []string{"/admin/v1/cluster", "/admin/v1/usage"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusNotFound {
			t.Errorf("GET %s without Options.Cluster = %d, want 404", path, rec.Code)
		}
	}
}

// usageLedger is a Cluster whose ledger answers with report or err, and
// keeps the query it was asked.
type usageLedger struct {
	asked  cluster.UsageQuery
	report cluster.UsageReport
	err    error
}

func (u *usageLedger) View(context.Context) cluster.View { return cluster.View{} }
func (u *usageLedger) Usage(_ context.Context, q cluster.UsageQuery) (cluster.UsageReport, error) {
	u.asked = q
	return u.report, u.err
}

// GET /admin/v1/usage reads its window and grouping, refuses what it
// cannot answer, and says 503 with the database away.
func TestUsageReadsItsWindowAndGrouping(t *testing.T) {
	reg := fleet.New(fleet.Options{})
	ledger := &usageLedger{report: cluster.UsageReport{Rows: []cluster.UsageRow{{UsageDims: cluster.UsageDims{Principal: "alice"}, Counts: cluster.Counts{Requests: 3}}}}}
	h := adminapi.Handler(reg, func() error { return nil }, adminapi.Options{OpenReads: true, Cluster: ledger})

	rec, body := get(t, h, "/admin/v1/usage")
	if rec.Code != http.StatusOK || body["rows"].([]any)[0].(map[string]any)["principal"] != "alice" {
		t.Fatalf("GET /admin/v1/usage = %d %v", rec.Code, body)
	}
	if q := ledger.asked; q.To.Sub(q.From) != time.Hour || len(q.By) != 3 {
		t.Errorf("default query %+v, want the last hour by principal, model and node", q)
	}
	if rec, _ := get(t, h, "/admin/v1/usage?window=24h&by=edge,model"); rec.Code != http.StatusOK ||
		ledger.asked.To.Sub(ledger.asked.From) != 24*time.Hour || len(ledger.asked.By) != 2 || ledger.asked.By[0] != "edge" {
		t.Errorf("window=24h&by=edge,model: %d, asked %+v", rec.Code, ledger.asked)
	}
	if rec, _ := get(t, h, "/admin/v1/usage?by=&from=2026-05-01T00:00:00Z&to=2026-05-02T00:00:00Z"); rec.Code != http.StatusOK ||
		len(ledger.asked.By) != 0 || !ledger.asked.From.Equal(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("from/to, one total: %d, asked %+v", rec.Code, ledger.asked)
	}
	for _, bad := range []string{"?by=colour", "?window=-1h", "?window=soon", "?from=yesterday", "?window=1h&from=2026-05-01T00:00:00Z",
		"?window=2160h1s", "?from=2026-05-02T00:00:00Z&to=2026-05-01T00:00:00Z"} {
		if rec, body := get(t, h, "/admin/v1/usage"+bad); rec.Code != http.StatusBadRequest || body["error"] == "" {
			t.Errorf("GET /admin/v1/usage%s = %d %v, want 400 with the reason", bad, rec.Code, body)
		}
	}
	ledger.err = errors.New("cluster: usage: the database is unreachable")
	if rec, body := get(t, h, "/admin/v1/usage"); rec.Code != http.StatusServiceUnavailable || body["error"] != ledger.err.Error() {
		t.Errorf("with the database away: %d %v, want 503 with the reason", rec.Code, body)
	}
}
