package adminapi_test

import (
	"net/http"
	"testing"

	"github.com/iop-dev/iop/internal/edge/adminapi"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/wake"
)

// /admin/v1/wake lists the Nodes the Edge can wake with their state
// (issue 23), as a read: closed to anyone but an admin unless reads are
// open; without Options.Wake it is not served.
func TestWakeListsTheNodesTheEdgeCanWake(t *testing.T) {
	reg := fleet.New(fleet.Options{})
	nodes := func() any {
		return []wake.NodeView{{Node: "gpu-2", State: wake.Sleeping, Models: []string{"big"}, Wakers: []wake.WakerView{{Node: "gpu-1", Connected: true}}}}
	}
	rec, body := get(t, adminapi.Handler(reg, func() error { return nil }, adminapi.Options{OpenReads: true, Wake: nodes}), "/admin/v1/wake")
	ns, ok := body["nodes"].([]any)
	if rec.Code != http.StatusOK || !ok || len(ns) != 1 {
		t.Fatalf("GET /admin/v1/wake = %d %v", rec.Code, body)
	}
	if n := ns[0].(map[string]any); n["node"] != "gpu-2" || n["state"] != "sleeping" {
		t.Errorf("node = %v", n)
	}
	if rec, _ := get(t, adminapi.Handler(reg, func() error { return nil }, adminapi.Options{Wake: nodes}), "/admin/v1/wake"); rec.Code != http.StatusUnauthorized && rec.Code != http.StatusForbidden {
		t.Errorf("closed reads: GET /admin/v1/wake = %d, want refused", rec.Code)
	}
}
