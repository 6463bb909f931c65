package openaiapi

import (
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/yamlconf"
)

// profileWith is the default profile with its keep-alive interval set.
func profileWith(keepAlive time.Duration) *edgeconfig.Profile {
	p := edgeconfig.DefaultProfile()
	p.KeepAliveInterval = yamlconf.Duration(keepAlive)
	return &p
}

// splitSSE splits a stream into its comment lines and data payloads, in
// order, failing on anything else.
func splitSSE(t *testing.T, body string) (kinds []string) {
	t.Helper()
	for _, ev := range strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		switch {
		case ev == ": keep-alive":
			kinds = append(kinds, "keep-alive")
		case strings.HasPrefix(ev, "data: "):
			kinds = append(kinds, strings.TrimPrefix(ev, "data: "))
		default:
			t.Fatalf("malformed event %q in %q", ev, body)
		}
	}
	return kinds
}

// Issue 11: a streamed request waiting in a silent prefill gets its
// headers and an SSE comment every keepalive_interval, so proxies with a
// first-byte limit do not cut it, then its answer. Under the default
// profile, a prefill longer than the old 2m idle default completes: the
// idle timeout now sits above the stall timeout, and keep-alives do not
// count as answer bytes.
func TestASilentPrefillGetsKeepAlivesThenItsAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &ft.Dispatcher{Profile: profileWith(15 * time.Second),
			Events: []ft.Step{ft.After(130*time.Second, ft.Text("late")), ft.Completed("stop")}}
		e := newEnv(t, f)
		w := e.do(chatReq(streamBody))
		if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "text/event-stream" {
			t.Fatalf("status %d, content type %q: %s", w.Code, w.Header().Get("Content-Type"), w.Body)
		}
		kinds := splitSSE(t, w.Body.String())
		alive := 0
		for alive < len(kinds) && kinds[alive] == "keep-alive" {
			alive++
		}
		if alive != 8 { // 130 s of silence, one every 15 s (checked every 15/4 s)
			t.Errorf("%d keep-alives before the answer, want 8: %q", alive, kinds)
		}
		rest := strings.Join(kinds[alive:], "\n")
		if !strings.Contains(rest, `"content":"late"`) || kinds[len(kinds)-1] != "[DONE]" || strings.Contains(rest, `"error"`) {
			t.Errorf("after the keep-alives: %q", kinds[alive:])
		}
		if e.requests(t, "ok") != 1 {
			t.Error("the request was not counted ok")
		}
	})
}

// Issue 11: once a keep-alive has committed the response, a refusal is an
// SSE error event and [DONE]: never a silent end, never a second status.
func TestAQueueTimeoutAfterAKeepAliveIsAnInStreamError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &ft.Dispatcher{Profile: profileWith(10 * time.Second), QueueFor: 30 * time.Second}
		e := newEnv(t, f)
		w := e.do(chatReq(streamBody))
		kinds := splitSSE(t, w.Body.String())
		if w.Code != http.StatusOK || len(kinds) < 3 || kinds[0] != "keep-alive" || kinds[len(kinds)-1] != "[DONE]" {
			t.Fatalf("status %d: %q", w.Code, kinds)
		}
		if b := apiErrorOf(t, kinds[len(kinds)-2]); codeOf(b) != "queue_timeout" {
			t.Errorf("in-stream error %q, want queue_timeout", codeOf(b))
		}
		if e.requests(t, "queue_timeout") != 1 {
			t.Error("the refusal was not counted")
		}
	})
}

// A request that is not streamed gets no comments (JSON has none); one
// that answers before the interval gets none either.
func TestNoKeepAlivesWhenNotStreamedOrNotSilent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &ft.Dispatcher{Profile: profileWith(15 * time.Second),
			Events: []ft.Step{ft.After(40*time.Second, ft.Text("a")), ft.Completed("stop")}}
		e := newEnv(t, f)
		if w := e.do(chatReq(plainBody)); w.Code != http.StatusOK || strings.Contains(w.Body.String(), "keep-alive") {
			t.Errorf("whole response: %d %q", w.Code, w.Body)
		}
		f = &ft.Dispatcher{Profile: profileWith(15 * time.Second),
			Events: []ft.Step{ft.After(5*time.Second, ft.Text("a")), ft.Completed("stop")}}
		e = newEnv(t, f)
		if w := e.do(chatReq(streamBody)); strings.Contains(w.Body.String(), "keep-alive") {
			t.Errorf("a prompt answer got keep-alives: %q", w.Body)
		}
	})
}
