package frontend_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Issue 22: an embedding call's usage, which comes with its terminal,
// reaches its status page entry, and through it the usage ledger.
func TestAnEmbeddingsUsageReachesItsEntry(t *testing.T) {
	c := edgeconfig.Default()
	open := true
	c.API.AllowAnonymous = &open
	a, err := auth.New(c)
	if err != nil {
		t.Fatal(err)
	}
	d := &ft.Dispatcher{Embedding: &dispatch.Embedding{ID: "e1", Node: sched.Candidate{NodeID: "n1"},
		Terminal: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, Usage: &wirepb.Usage{PromptTokens: 42}}}}
	tr := inflight.New(inflight.Options{})
	front := frontend.New(d, a, frontend.Options{Live: tr})
	h := front.Handler(&frontend.API{ErrorBody: func(f *frontend.Failure) any { return map[string]string{"error": f.Message} }},
		&frontend.Endpoint{Route: "test_embed", Log: "test",
			Peek: func([]byte) (frontend.Peek, *frontend.Failure) { return frontend.Peek{Model: "m1"}, nil },
			Translate: func(t *frontend.Turn) (frontend.Job, *frontend.Failure) {
				return &frontend.EmbedJob{Embed: &wirepb.EmbedRequest{Inputs: []string{"x"}},
					Out: func(r *frontend.Response, _ *dispatch.Embedding) bool { return r.End([]byte("{}")) }}, nil
			}})
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{}")))
	if w.Code != http.StatusOK {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	recent := tr.Snapshot().Recent
	if len(recent) != 1 || recent[0].PromptTokens != 42 || recent[0].Reason != inflight.Completed {
		t.Errorf("recent = %+v, want the embedding completed with its 42 prompt tokens", recent)
	}
}
