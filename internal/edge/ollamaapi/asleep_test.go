package ollamaapi

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
)

// Issue 23: a model that only a sleeping Node served is listed by
// /api/tags as any other, so the official client can pick it (a request
// wakes the Node), with asleep_on naming the Nodes; /api/ps does not list
// it (nothing has it loaded).
func TestASleepingNodesModelIsListedAsleep(t *testing.T) {
	c, e := officialClient(t, &ft.Dispatcher{Offerings: []dispatch.Offering{{ID: "big:latest", Asleep: []string{"gpu-2"}}}})
	tags, err := c.List(t.Context())
	if err != nil || len(tags.Models) != 1 || tags.Models[0].Name != "big:latest" {
		t.Fatalf("tags: %+v %v", tags, err)
	}
	ps, err := c.ListRunning(t.Context())
	if err != nil || len(ps.Models) != 0 {
		t.Errorf("ps lists a sleeping Node's model: %+v %v", ps, err)
	}
	w := e.do(req(http.MethodGet, "/api/tags", ""))
	var raw struct {
		Models []struct {
			Name     string   `json:"name"`
			AsleepOn []string `json:"asleep_on"`
		} `json:"models"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &raw); err != nil || len(raw.Models) != 1 ||
		len(raw.Models[0].AsleepOn) != 1 || raw.Models[0].AsleepOn[0] != "gpu-2" {
		t.Fatalf("/api/tags answered %d %s, want big:latest asleep_on [gpu-2]", w.Code, w.Body)
	}
}
