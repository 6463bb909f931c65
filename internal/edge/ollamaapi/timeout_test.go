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
		runner  *fakeRunner
		started bool // output had started: the error is in-stream
	}{
		{"silent prefill", &fakeRunner{silent: true}, false},
		{"silent after output", &fakeRunner{silent: true, pieces: []piece{line(`{"response":"a"}`)}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := tt.runner
				f.idle = idle
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
				if msg := errorOf(t, strings.TrimSuffix(body, "\n")); msg != errIdle.message {
					t.Errorf("error %q", msg)
				}
				if !f.startBlocks && !f.tunnel(t).cancelledWith(ErrIdleTimeout) {
					t.Error("the tunnel was not cancelled with ErrIdleTimeout")
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
		f := &fakeRunner{idle: 5 * time.Second, queueFor: 30 * time.Second}
		e := newEnv(t, f)
		start := time.Now()
		w := e.do(req(http.MethodPost, "/api/chat", `{"model":"m1","messages":[]}`))
		if d := time.Since(start); d != 30*time.Second {
			t.Errorf("ended after %v, want the queue timeout (30s)", d)
		}
		if w.Code != http.StatusTooManyRequests || w.Header().Get(RefusalHeader) != "queue_timeout" || w.Header().Get("Retry-After") == "" {
			t.Fatalf("status %d refusal %q Retry-After %q, want 429 queue_timeout: %s",
				w.Code, w.Header().Get(RefusalHeader), w.Header().Get("Retry-After"), w.Body)
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
		e := newEnv(t, &fakeRunner{idle: 10 * time.Second, pieces: []piece{
			after(8*time.Second, line("a")), after(8*time.Second, line("b")), after(8*time.Second, line(`{"done":true}`)),
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
	for _, pieces := range [][]piece{nil, {line("a")}} {
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t, &fakeRunner{silent: true, pieces: pieces, deadline: 20 * time.Second, idle: 30 * time.Second})
			w := e.do(req(http.MethodPost, "/api/chat", chatBody))
			body := w.Body.String()
			if pieces != nil {
				body = strings.TrimSuffix(strings.TrimPrefix(body, "a\n"), "\n")
			} else if w.Code != 504 {
				t.Fatalf("status %d", w.Code)
			}
			if msg := errorOf(t, body); msg != errDeadline.message {
				t.Errorf("error %q", msg)
			}
			if e.cancellations(t, "deadline") != 1 {
				t.Error("deadline cancellation not counted")
			}
		})
	}
}

// TestClientGoneCancelsTunnel: a client that goes away cancels its tunnel
// with ErrClientGone, whether it was waiting for a slot, in a prefill or
// reading a stream.
func TestClientGoneCancelsTunnel(t *testing.T) {
	tests := []struct {
		name   string
		runner *fakeRunner
	}{
		{"waiting in StartTunnel", &fakeRunner{startBlocks: true}},
		{"silent prefill", &fakeRunner{silent: true}},
		{"mid-stream", &fakeRunner{silent: true, pieces: []piece{line("a")}}},
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
				if !f.startBlocks && !f.tunnel(t).cancelledWith(ErrClientGone) {
					t.Error("the tunnel was not cancelled with ErrClientGone")
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
	f := &fakeRunner{silent: true, pieces: []piece{line("a")}}
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
	case <-f.tunnel(t).closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the tunnel was not ended after the client left")
	}
	if !f.tunnel(t).cancelledWith(ErrClientGone) {
		t.Error("the tunnel was not cancelled with ErrClientGone")
	}
	srv.Close() // waits for the handler to return
	if e.cancellations(t, "client_gone") != 1 || e.activeTunnels(t) != 0 {
		t.Errorf("cancellations %v, active %v", e.cancellations(t, "client_gone"), e.activeTunnels(t))
	}
}
