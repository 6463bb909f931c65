package ollamaapi

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
)

// The timer tests run in a synctest bubble, with the handler served
// in-process (httptest.ResponseRecorder): a real socket would never let
// the bubble's clock advance.

// TestIdleTimeoutEndsSilentRequest: the client response-idle timeout (SPEC
// S5) counts from admission, so a silent prefill ends with 504, and a
// silence after output with the error line.
func TestIdleTimeoutEndsSilentRequest(t *testing.T) {
	const idle = 30 * time.Second
	tests := []struct {
		name    string
		runner  *ft.Dispatcher
		started bool // output had started: the error is in-stream
	}{
		{"silent prefill", &ft.Dispatcher{Silent: true}, false},
		{"silent after output", &ft.Dispatcher{Silent: true, Pieces: []ft.Step{ft.Line(`{"response":"a"}`)}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := tt.runner
				f.Idle = idle
				e := newEnv(t, f)
				start := time.Now()
				w := e.do(req(http.MethodPost, "/api/generate", `{"model":"m1","prompt":"hi"}`))
				if d := time.Since(start); d != idle {
					t.Errorf("ended after %v, want %v", d, idle)
				}
				body := w.Body.String()
				want := 504
				if tt.started {
					want = 200
					var ok bool
					if body, ok = strings.CutPrefix(body, `{"response":"a"}`+"\n"); !ok {
						t.Fatalf("body %q", w.Body)
					}
				}
				if w.Code != want {
					t.Fatalf("status %d, want %d: %s", w.Code, want, w.Body)
				}
				if msg := errorTextOf(t, strings.TrimSuffix(body, "\n")); msg != frontend.FailIdle.Message {
					t.Errorf("error %q", msg)
				}
				if !f.StartBlocks && !f.Tunnel(t).CancelledWith(frontend.ErrIdleTimeout) {
					t.Error("the tunnel was not cancelled with frontend.ErrIdleTimeout")
				}
				if e.cancellations(t, "idle_timeout") != 1 || e.requests(t, routeGenerate, "idle_timeout") != 1 {
					t.Errorf("cancellations %v, requests %v", e.cancellations(t, "idle_timeout"), e.requests(t, routeGenerate, "idle_timeout"))
				}
			})
		})
	}
}

// Issue 10, S5: the queue wait is the queue timeout's alone: with an idle
// timeout shorter than the wait, the request still gets 429 queue_timeout.
func TestQueueTimeoutWinsOverAShorterIdleTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &ft.Dispatcher{Idle: 5 * time.Second, QueueFor: 30 * time.Second}
		e := newEnv(t, f)
		start := time.Now()
		w := e.do(req(http.MethodPost, "/api/chat", `{"model":"m1","messages":[]}`))
		if d := time.Since(start); d != 30*time.Second {
			t.Errorf("ended after %v, want the queue timeout (30s)", d)
		}
		if w.Code != http.StatusTooManyRequests || w.Header().Get(frontend.RefusalHeader) != "queue_timeout" || w.Header().Get("Retry-After") == "" {
			t.Fatalf("status %d refusal %q Retry-After %q, want 429 queue_timeout: %s",
				w.Code, w.Header().Get(frontend.RefusalHeader), w.Header().Get("Retry-After"), w.Body)
		}
		if e.cancellations(t, "idle_timeout") != 0 {
			t.Error("the idle timer fired during the queue wait")
		}
	})
}

// TestIdleTimerRestartsOnEveryByte: pauses shorter than the idle timeout do
// not end a request however long it runs.
func TestIdleTimerRestartsOnEveryByte(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, &ft.Dispatcher{Idle: 10 * time.Second, Pieces: []ft.Step{
			ft.After(8*time.Second, ft.Line("a")), ft.After(8*time.Second, ft.Line("b")), ft.After(8*time.Second, ft.Line(`{"done":true}`)),
		}})
		w := e.do(req(http.MethodPost, "/api/chat", chatBody))
		if w.Code != 200 || w.Body.String() != "a\nb\n{\"done\":true}\n" {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	})
}

// TestDeadlineReportsDeadlineExceeded: when the profile's hard deadline
// ends the tunnel's context, the client hears that, not a generic cancel,
// before output as 504 and after it as the error line.
func TestDeadlineReportsDeadlineExceeded(t *testing.T) {
	for _, pieces := range [][]ft.Step{nil, {ft.Line("a")}} {
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t, &ft.Dispatcher{Silent: true, Pieces: pieces, Deadline: 20 * time.Second, Idle: 30 * time.Second})
			w := e.do(req(http.MethodPost, "/api/chat", chatBody))
			body := w.Body.String()
			if pieces != nil {
				body = strings.TrimSuffix(strings.TrimPrefix(body, "a\n"), "\n")
			} else if w.Code != 504 {
				t.Fatalf("status %d", w.Code)
			}
			if msg := errorTextOf(t, body); msg != frontend.FailDeadline.Message {
				t.Errorf("error %q", msg)
			}
			if e.cancellations(t, "deadline") != 1 {
				t.Error("deadline cancellation not counted")
			}
		})
	}
}

// TestClientGoneCancelsTunnel: a client that goes away cancels its tunnel
// with frontend.ErrClientGone, whether it was waiting for a slot, in a prefill or
// reading a stream.
func TestClientGoneCancelsTunnel(t *testing.T) {
	tests := []struct {
		name   string
		runner *ft.Dispatcher
	}{
		{"waiting in StartTunnel", &ft.Dispatcher{StartBlocks: true}},
		{"silent prefill", &ft.Dispatcher{Silent: true}},
		{"mid-stream", &ft.Dispatcher{Silent: true, Pieces: []ft.Step{ft.Line("a")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := tt.runner
				e := newEnv(t, f)
				ctx, cancel := context.WithCancel(t.Context())
				time.AfterFunc(5*time.Second, cancel)
				start := time.Now()
				e.do(req(http.MethodPost, "/api/chat", chatBody).WithContext(ctx))
				if d := time.Since(start); d != 5*time.Second {
					t.Errorf("handler returned after %v, want 5s", d)
				}
				if !f.StartBlocks && !f.Tunnel(t).CancelledWith(frontend.ErrClientGone) {
					t.Error("the tunnel was not cancelled with frontend.ErrClientGone")
				}
				if e.cancellations(t, "client_gone") != 1 || e.requests(t, routeChat, "cancelled") != 1 {
					t.Errorf("cancellations %v, requests %v", e.cancellations(t, "client_gone"), e.requests(t, routeChat, "cancelled"))
				}
			})
		})
	}
}

// TestClientClosingConnectionCancelsTunnel is the same over a real socket:
// the tunnel, and through it the provider's request, ends when the client
// hangs up during a silence.
func TestClientClosingConnectionCancelsTunnel(t *testing.T) {
	f := &ft.Dispatcher{Silent: true, Pieces: []ft.Step{ft.Line("a")}}
	e := newEnv(t, f)
	srv := httptest.NewServer(e.handler)
	defer srv.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/api/chat", strings.NewReader(chatBody))
	r.Header.Set("Authorization", "Bearer "+testKey)
	res, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := bufio.NewReader(res.Body).ReadString('\n'); err != nil || l != "a\n" {
		t.Fatalf("first line %q, %v", l, err)
	}
	cancel() // the client goes away while the provider is silent
	res.Body.Close()
	select {
	case <-f.Tunnel(t).Closed():
	case <-time.After(10 * time.Second):
		t.Fatal("the tunnel was not ended after the client left")
	}
	if !f.Tunnel(t).CancelledWith(frontend.ErrClientGone) {
		t.Error("the tunnel was not cancelled with frontend.ErrClientGone")
	}
	srv.Close() // waits for the handler to return
	if e.cancellations(t, "client_gone") != 1 || e.activeTunnels(t) != 0 {
		t.Errorf("cancellations %v, active %v", e.cancellations(t, "client_gone"), e.activeTunnels(t))
	}
}
