package frontend_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Issue 21, P3: a request's body and the run it becomes are bounded by the
// Edge's request limit (limits.max_request_mib), not by one frame: a run
// within it is started, sized for the dispatcher (Plan.Size, which offers
// it only to Nodes that take it); one past it is 413 naming the limit, and
// nothing starts.
func TestTheRequestLimitBoundsTheRunNotTheFrame(t *testing.T) {
	const limit = 4 << 20
	c := edgeconfig.Default()
	open := true
	c.API.AllowAnonymous = &open
	a, err := auth.New(c)
	if err != nil {
		t.Fatal(err)
	}
	d := &ft.Dispatcher{Events: []ft.Step{ft.Text("ok"), ft.Completed("stop")}}
	front := frontend.New(d, a, frontend.Options{Door: frontdoor.New(frontdoor.Limits{MaxRequest: limit}, nil)})
	// The endpoint's run is a MiB of text per byte of its body: a small
	// body may ask for a run past the limit, as a translation that adds to
	// the body could.
	h := front.Handler(&frontend.API{ErrorBody: func(f *frontend.Failure) any { return map[string]string{"error": f.Message} }},
		&frontend.Endpoint{Route: "test", Log: "test",
			Peek: func([]byte) (frontend.Peek, *frontend.Failure) { return frontend.Peek{Model: "m1"}, nil },
			Translate: func(t *frontend.Turn) (frontend.Job, *frontend.Failure) {
				text := strings.Repeat("x", len(t.Body)<<20)
				run := &wirepb.RunRequest{Messages: []*wirepb.ChatMessage{{Role: "user", Content: text}}}
				return &frontend.RunJob{Run: run, Out: discard{t.Response()}}, nil
			}})
	for _, c := range []struct {
		body    string
		status  int
		started bool
	}{
		{"xxx", http.StatusOK, true},               // a 3 MiB run: past a frame, within the limit
		{"xxxxx", 413, false},                      // a 5 MiB run: past the limit
		{strings.Repeat("y", limit+1), 413, false}, // the body itself past the limit
	} {
		before := len(d.Plans())
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(c.body)))
		if w.Code != c.status {
			t.Fatalf("body of %d bytes: %d %s, want %d", len(c.body), w.Code, w.Body, c.status)
		}
		plans := d.Plans()
		if started := len(plans) > before; started != c.started {
			t.Fatalf("body of %d bytes: started %v, want %v", len(c.body), started, c.started)
		}
		if c.status == 413 && !strings.Contains(w.Body.String(), "limit") {
			t.Errorf("body of %d bytes: %s, want the limit named", len(c.body), w.Body)
		}
		if c.started && plans[len(plans)-1].Size < 3<<20 {
			t.Errorf("the plan's size is %d, want at least the run's 3 MiB", plans[len(plans)-1].Size)
		}
	}
}

// discard answers a run with nothing but its end.
type discard struct{ resp *frontend.Response }

func (discard) Started(string)                 {}
func (discard) Text(string) bool               { return true }
func (discard) Reasoning(string) bool          { return true }
func (discard) ToolCall(*wirepb.ToolCall) bool { return true }
func (discard) Usage(*wirepb.Usage)            {}
func (w discard) Complete(string) bool         { return w.resp.End(nil) }
func (w discard) Fail(*frontend.Failure)       { w.resp.End(nil) }
