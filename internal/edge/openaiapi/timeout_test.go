package openaiapi

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
// S5) counts from admission, so a silent prefill ends with 504
// idle_timeout, and once output has started with an error event.
func TestIdleTimeoutEndsSilentRequest(t *testing.T) {
	const idle = 30 * time.Second
	tests := []struct {
		name    string
		runner  *ft.Dispatcher
		body    string
		status  int
		started bool // output had started: the error is in-stream
	}{
		{"silent prefill, streaming", &ft.Dispatcher{}, streamBody, 504, false},
		{"silent prefill, whole response", &ft.Dispatcher{}, plainBody, 504, false},
		{"silent after output", &ft.Dispatcher{Events: []ft.Step{ft.Text("a")}}, streamBody, 200, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := tt.runner
				f.Idle = idle
				e := newEnv(t, f)
				start := time.Now()
				w := e.do(chatReq(tt.body))
				if d := time.Since(start); d != idle {
					t.Errorf("ended after %v, want %v", d, idle)
				}
				if w.Code != tt.status {
					t.Fatalf("status %d, want %d: %s", w.Code, tt.status, w.Body)
				}
				body := w.Body.String()
				if tt.started {
					evs := events(t, body)
					body = evs[len(evs)-2]
					if evs[len(evs)-1] != "[DONE]" {
						t.Errorf("no [DONE] after the error: %v", evs)
					}
				}
				if b := apiErrorOf(t, body); codeOf(b) != "idle_timeout" {
					t.Errorf("code %q, want idle_timeout", codeOf(b))
				}
				if !f.StartBlocks && !f.Run(t).CancelledWith(frontend.ErrIdleTimeout) {
					t.Error("the run was not cancelled with frontend.ErrIdleTimeout")
				}
				if e.cancellations(t, "idle_timeout") != 1 || e.requests(t, "idle_timeout") != 1 {
					t.Errorf("cancellations %v, requests %v", e.cancellations(t, "idle_timeout"), e.requests(t, "idle_timeout"))
				}
			})
		})
	}
}

// Issue 10, S5: the queue wait is the queue timeout's alone. A request
// whose idle timeout is shorter than its queue wait is not ended by the
// idle timer while it waits: it gets 429 queue_timeout when the queue
// timeout fires, as it would with a long idle timeout.
func TestQueueTimeoutWinsOverAShorterIdleTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &ft.Dispatcher{Idle: 5 * time.Second, QueueFor: 30 * time.Second}
		e := newEnv(t, f)
		start := time.Now()
		w := e.do(chatReq(streamBody))
		if d := time.Since(start); d != 30*time.Second {
			t.Errorf("ended after %v, want the queue timeout (30s)", d)
		}
		b := apiErrorOf(t, w.Body.String())
		if w.Code != http.StatusTooManyRequests || codeOf(b) != "queue_timeout" || w.Header().Get("Retry-After") == "" {
			t.Fatalf("status %d code %q Retry-After %q, want 429 queue_timeout with Retry-After: %s",
				w.Code, codeOf(b), w.Header().Get("Retry-After"), w.Body)
		}
		if e.cancellations(t, "idle_timeout") != 0 {
			t.Error("the idle timer fired during the queue wait")
		}
	})
}

// TestIdleTimerRestartsOnEveryByte: pauses shorter than the idle timeout do
// not end a request however long it runs. For a response sent whole, each
// event of the run counts, since the client is sent nothing until the end.
func TestIdleTimerRestartsOnEveryByte(t *testing.T) {
	for _, body := range []string{streamBody, plainBody} {
		t.Run(body, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, &ft.Dispatcher{Idle: 10 * time.Second, Events: []ft.Step{
					ft.After(8*time.Second, ft.Reasoning("r")), ft.After(8*time.Second, ft.Text("a")),
					ft.After(8*time.Second, ft.ToolCall(0, "c", "f", "{}")), ft.After(8*time.Second, ft.Completed("stop")),
				}})
				w := e.do(chatReq(body))
				if w.Code != http.StatusOK || strings.Contains(w.Body.String(), `"error"`) {
					t.Fatalf("status %d: %s", w.Code, w.Body)
				}
				if e.requests(t, "ok") != 1 {
					t.Error("not counted ok")
				}
			})
		})
	}
}

// TestIdleTimerCountsOnlyBytesToTheClient: a streamed run's usage event
// sends nothing, so it does not restart the timer.
func TestIdleTimerCountsOnlyBytesToTheClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, &ft.Dispatcher{Idle: 10 * time.Second, Events: []ft.Step{
			ft.After(6*time.Second, ft.Usage(1, 0)), ft.After(6*time.Second, ft.Text("late")),
		}})
		start := time.Now()
		w := e.do(chatReq(streamBody))
		if w.Code != http.StatusGatewayTimeout || time.Since(start) != 10*time.Second {
			t.Fatalf("status %d after %v: %s", w.Code, time.Since(start), w.Body)
		}
	})
}

// TestDeadlineReportsDeadlineExceeded: when the profile's hard deadline
// ends the run's context, the client hears deadline_exceeded, not a
// generic cancel, even when the idle timeout would have fired later.
func TestDeadlineReportsDeadlineExceeded(t *testing.T) {
	tests := []struct {
		name  string
		steps []ft.Step
		body  string
	}{
		{"before output", nil, plainBody},
		{"after output", []ft.Step{ft.Text("a")}, streamBody},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &ft.Dispatcher{Events: tt.steps, Deadline: 20 * time.Second, Idle: 30 * time.Second}
				e := newEnv(t, f)
				w := e.do(chatReq(tt.body))
				body := w.Body.String()
				if tt.steps != nil {
					evs := events(t, body)
					body = evs[len(evs)-2]
				} else if w.Code != http.StatusGatewayTimeout {
					t.Fatalf("status %d", w.Code)
				}
				if b := apiErrorOf(t, body); codeOf(b) != "deadline_exceeded" {
					t.Errorf("code %q: %s", codeOf(b), body)
				}
				if e.cancellations(t, "deadline") != 1 {
					t.Error("deadline cancellation not counted")
				}
			})
		})
	}
}

// TestClientGoneCancelsRun: a client that goes away cancels its run with
// frontend.ErrClientGone, whether it was waiting for a slot, in a prefill or
// reading a stream.
func TestClientGoneCancelsRun(t *testing.T) {
	tests := []struct {
		name   string
		runner *ft.Dispatcher
		body   string
	}{
		{"waiting in StartRun", &ft.Dispatcher{StartBlocks: true}, plainBody},
		{"silent prefill", &ft.Dispatcher{}, plainBody},
		{"mid-stream", &ft.Dispatcher{Events: []ft.Step{ft.Text("a")}}, streamBody},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := tt.runner
				e := newEnv(t, f)
				ctx, cancel := context.WithCancel(t.Context())
				time.AfterFunc(5*time.Second, cancel)
				start := time.Now()
				e.do(chatReq(tt.body).WithContext(ctx))
				if d := time.Since(start); d != 5*time.Second {
					t.Errorf("handler returned after %v, want 5s", d)
				}
				if !f.StartBlocks && !f.Run(t).CancelledWith(frontend.ErrClientGone) {
					t.Error("the run was not cancelled with frontend.ErrClientGone")
				}
				if e.cancellations(t, "client_gone") != 1 || e.requests(t, "cancelled") != 1 {
					t.Errorf("cancellations %v, requests %v", e.cancellations(t, "client_gone"), e.requests(t, "cancelled"))
				}
			})
		})
	}
}

// TestClientClosingConnectionCancelsRun is the same over a real socket.
func TestClientClosingConnectionCancelsRun(t *testing.T) {
	f := &ft.Dispatcher{Events: []ft.Step{ft.Text("a")}}
	e := newEnv(t, f)
	srv := httptest.NewServer(e.handler)
	defer srv.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Authorization", "Bearer "+testKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(res.Body)
	for seen := 0; seen < 2; { // the role chunk and "a"
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") {
			seen++
		}
	}
	cancel() // the client goes away while the run is silent
	res.Body.Close()
	select {
	case <-f.Run(t).Closed():
	case <-time.After(10 * time.Second):
		t.Fatal("the run was not ended after the client left")
	}
	if !f.Run(t).CancelledWith(frontend.ErrClientGone) {
		t.Error("the run was not cancelled with frontend.ErrClientGone")
	}
	srv.Close() // waits for the handler to return
	if e.cancellations(t, "client_gone") != 1 || e.activeRuns(t) != 0 {
		t.Errorf("cancellations %v, active %v", e.cancellations(t, "client_gone"), e.activeRuns(t))
	}
}
