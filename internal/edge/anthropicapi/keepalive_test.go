package anthropicapi

import (
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/internal/yamlconf"
)

// The timer tests run in a synctest bubble, with the handler served
// in-process: a real socket would never let the bubble's clock advance.

// profileWith is the default profile with its keep-alive interval and
// idle timeout set.
func profileWith(keepAlive, idle time.Duration) *edgeconfig.Profile {
	p := edgeconfig.DefaultProfile()
	p.KeepAliveInterval = yamlconf.Duration(keepAlive)
	if idle > 0 {
		p.IdleTimeout = yamlconf.Duration(idle)
	}
	return &p
}

// pingsFirst counts the pings before the first event of the answer.
func pingsFirst(evs []sse) int {
	n := 0
	for _, e := range evs[1:] { // after message_start
		if e.name != "ping" {
			break
		}
		n++
	}
	return n
}

// Issue 12 (as issue 11 for OpenAI): a streamed request waiting in the
// queue and then in a silent prefill gets its headers, message_start and
// a ping every keepalive_interval, so proxies with a first-byte limit do
// not cut it; then its answer.
func TestAStreamWaitingGetsPingsThenItsAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &ft.Dispatcher{Profile: profileWith(15*time.Second, 0), AdmitAfter: 50 * time.Second,
			Events: []ft.Step{ft.After(80*time.Second, ft.Text("late")), ft.Completed("stop")}}
		e := newEnv(t, f)
		w := e.post(streamBody)
		evs := events(t, w.Body.String())
		if w.Code != http.StatusOK || evs[0].name != "message_start" {
			t.Fatalf("status %d, events %s", w.Code, names(evs))
		}
		if n := pingsFirst(evs); n != 8 { // 130 s of silence, one every 15 s (checked every 15/4 s)
			t.Errorf("%d pings before the answer, want 8: %s", n, names(evs))
		}
		rest := names(evs[1+pingsFirst(evs):])
		if rest != "content_block_start content_block_delta content_block_stop message_delta message_stop" {
			t.Errorf("after the pings: %s", rest)
		}
		if e.requests(t, "ok") != 1 {
			t.Error("not counted ok")
		}
	})
}

// Once a ping has committed the response, a refusal is an error event:
// never a second status.
func TestARefusalAfterAPingIsAnErrorEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &ft.Dispatcher{Profile: profileWith(10*time.Second, 0), AdmitAfter: 30 * time.Second,
			StartErr: &sched.RefusalError{Reason: sched.ReasonQueueTimeout, Model: "m1", RetryAfter: time.Second}}
		e := newEnv(t, f)
		w := e.post(streamBody)
		evs := events(t, w.Body.String())
		if w.Code != http.StatusOK || evs[0].name != "message_start" || evs[1].name != "ping" || evs[len(evs)-1].name != "error" {
			t.Fatalf("status %d, events %s", w.Code, names(evs))
		}
		if b := errorBodyOf(t, evs[len(evs)-1].data); b.Error.Type != typeRateLimit || !strings.Contains(b.Error.Message, "queue_timeout") {
			t.Errorf("error %+v", b.Error)
		}
	})
}

// A request that is not streamed gets no pings (JSON has none); one that
// answers within the interval gets none either.
func TestNoPingsWhenNotStreamedOrNotSilent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow := []ft.Step{ft.After(40*time.Second, ft.Text("a")), ft.Completed("stop")}
		w := newEnv(t, &ft.Dispatcher{Profile: profileWith(15*time.Second, 0), Events: slow}).post(plainBody)
		if w.Code != http.StatusOK || strings.Contains(w.Body.String(), "ping") {
			t.Errorf("whole response: %d %s", w.Code, w.Body)
		}
		quick := []ft.Step{ft.After(5*time.Second, ft.Text("a")), ft.Completed("stop")}
		w = newEnv(t, &ft.Dispatcher{Profile: profileWith(15*time.Second, 0), Events: quick}).post(streamBody)
		if strings.Contains(w.Body.String(), "ping") {
			t.Errorf("a prompt answer got pings: %s", w.Body)
		}
	})
}

// SPEC S5: the client response-idle timeout counts from admission and
// pings do not reset it; before output it is 504 timeout_error, after
// output an error event, and the run is cancelled.
func TestIdleTimeoutEndsASilentRun(t *testing.T) {
	for _, tt := range []struct {
		name   string
		script []ft.Step
		body   string
		status int
		event  bool
	}{
		{"silent prefill, whole", nil, plainBody, 504, false},
		{"silent after output, streamed", []ft.Step{ft.Text("a")}, streamBody, 200, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &ft.Dispatcher{Profile: profileWith(5*time.Second, 30*time.Second), Events: tt.script}
				e := newEnv(t, f)
				start := time.Now()
				w := e.post(tt.body)
				if d := time.Since(start); d != 30*time.Second {
					t.Errorf("ended after %v, want 30s", d)
				}
				body := w.Body.String()
				if tt.event {
					evs := events(t, body)
					body = evs[len(evs)-1].data
				}
				if b := errorBodyOf(t, body); w.Code != tt.status || b.Error.Type != typeTimeout {
					t.Errorf("status %d, error %+v", w.Code, b.Error)
				}
				if e.requests(t, "idle_timeout") != 1 {
					t.Error("not counted as idle_timeout")
				}
			})
		})
	}
}
