package ollamaapi

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
)

// Issue 26: a model served before the Edge restarted, whose Nodes are not
// back yet, is a 503 in Ollama's shape ({"error": ...} saying retry), not
// the "model 'x' not found" for which `ollama run` offers to pull it:
// through a run, a load and /api/show. /api/tags lists it; /api/ps does
// not (nothing runs it).
func TestOfficialClientIsToldToRetryAModelNotYetBack(t *testing.T) {
	c, _ := officialClient(t, &ft.Dispatcher{NotYetBack: []string{"m1"},
		Offerings: []dispatch.Offering{{ID: "m1", Reconnecting: true}}})
	for _, stream := range []bool{true, false} {
		err := c.Chat(t.Context(), &api.ChatRequest{Model: "m1", Stream: &stream, Messages: []api.Message{{Role: "user", Content: "hi"}}},
			func(api.ChatResponse) error { return nil })
		var se api.StatusError
		if !errors.As(err, &se) || se.StatusCode != http.StatusServiceUnavailable || !strings.Contains(se.ErrorMessage, "reconnecting; retry") {
			t.Errorf("chat (stream %v): %#v", stream, err)
		}
	}
	err := c.Generate(t.Context(), &api.GenerateRequest{Model: "m1"}, func(api.GenerateResponse) error { return nil })
	var se api.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("load: %#v", err)
	}
	if _, err := c.Show(t.Context(), &api.ShowRequest{Model: "m1"}); !errors.As(err, &se) || se.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("show: %#v", err)
	}
	tags, err := c.List(t.Context())
	if err != nil || len(tags.Models) != 1 || tags.Models[0].Name != "m1" {
		t.Errorf("tags: %+v %v", tags, err)
	}
	ps, err := c.ListRunning(t.Context())
	if err != nil || len(ps.Models) != 0 {
		t.Errorf("ps lists a model not yet back: %+v %v", ps, err)
	}
}
