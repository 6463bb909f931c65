package frontend

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/edgemetrics/metricstest"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/sched"
)

// work is a run or tunnel as the exchange sees it.
type work struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

func newWork(parent context.Context) *work {
	w := &work{}
	w.ctx, w.cancel = context.WithCancelCause(parent)
	return w
}

func (w *work) Cancel(cause error)       { w.cancel(cause) }
func (w *work) Context() context.Context { return w.ctx }

func newTestExchange(t *testing.T) (*Exchange, context.CancelFunc) {
	ctx, gone := context.WithCancel(t.Context())
	r := httptest.NewRequest("POST", "/", nil).WithContext(ctx)
	return NewExchange(httptest.NewRecorder(), r, "test", nil, nil), gone
}

// SPEC S5: the idle timer runs from admission, not arrival: a queue wait
// of any length does not fire it; after admission it fires exactly
// idleAfter after the last byte, and Wrote starts it over.
func TestTheIdleTimerRunsFromAdmissionAndEveryByteRestartsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x, _ := newTestExchange(t)
		ctx := x.Begin(10 * time.Second)
		defer x.End()
		time.Sleep(time.Hour) // queued
		if context.Cause(ctx) != nil {
			t.Fatalf("the idle timer fired during the queue wait: %v", context.Cause(ctx))
		}
		x.Admitted()
		w := newWork(ctx)
		x.Attach(w)
		time.Sleep(9 * time.Second)
		x.Wrote()
		time.Sleep(9 * time.Second)
		if context.Cause(w.ctx) != nil {
			t.Fatal("the idle timer fired though a byte went out 9 s ago")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if !errors.Is(context.Cause(w.ctx), ErrIdleTimeout) || !errors.Is(x.Why(), ErrIdleTimeout) {
			t.Fatalf("10 s after the last byte: work %v, why %v; want the idle timeout", context.Cause(w.ctx), x.Why())
		}
		x.Admitted() // a second admission (failover) does not restart anything
	})
}

// The client going away stops the request with ErrClientGone, at once; the
// first cause wins over any later one.
func TestTheClientGoingAwayStopsTheWorkFirstCauseWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x, gone := newTestExchange(t)
		ctx := x.Begin(time.Minute)
		defer x.End()
		x.Admitted()
		w := newWork(ctx)
		x.Attach(w)
		gone()
		synctest.Wait()
		if !errors.Is(context.Cause(w.ctx), ErrClientGone) {
			t.Fatalf("work cause %v, want client gone", context.Cause(w.ctx))
		}
		time.Sleep(2 * time.Minute) // the idle timer fires too, later
		if !errors.Is(x.Why(), ErrClientGone) {
			t.Fatalf("why %v, want the first cause, client gone", x.Why())
		}
	})
}

// Work attached after the request was stopped (the start raced the stop)
// is cancelled at once with the stop's cause: nothing outlives its
// request.
func TestWorkAttachedAfterAStopIsCancelledAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x, _ := newTestExchange(t)
		ctx := x.Begin(time.Minute)
		defer x.End()
		x.Stop(ErrIdleTimeout)
		w := newWork(context.WithoutCancel(ctx))
		x.Attach(w)
		if !errors.Is(context.Cause(w.ctx), ErrIdleTimeout) {
			t.Fatalf("work attached after the stop: %v, want cancelled with the idle timeout", context.Cause(w.ctx))
		}
	})
}

// The work's own cause (its deadline) is why the request ended when the
// request itself was not stopped.
func TestWhyPrefersTheWorksCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x, _ := newTestExchange(t)
		ctx := x.Begin(time.Hour)
		defer x.End()
		x.Admitted()
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		x.Attach(&work{ctx: wctx, cancel: func(error) { cancel() }})
		time.Sleep(2 * time.Minute)
		if !errors.Is(x.Why(), context.DeadlineExceeded) {
			t.Fatalf("why %v, want the deadline", x.Why())
		}
		if f := RunFailure(nil, x.Why()); f != FailDeadline {
			t.Fatalf("the failure of a deadline is %+v", f)
		}
	})
}

func testMetrics() *edgemetrics.Metrics { return edgemetrics.New(fleet.New(fleet.Options{}), nil) }

// A request is counted by route, model, principal and outcome. The model
// is a label only once the scheduler took the request for it (a slot, or
// a refusal for that model): a name the client made up never makes a
// series.
func TestRequestsAreLabelledByAModelOnlyOnceItWasScheduled(t *testing.T) {
	m := testMetrics()
	alice := auth.Principal{Name: "alice"}
	record := func(model string, admitted bool, f *Failure) {
		x := NewExchange(httptest.NewRecorder(), httptest.NewRequest("POST", "/", nil), "openai_chat", m, nil)
		x.p, x.model = alice, model
		if admitted {
			x.Begin(time.Minute)
			x.Admitted()
			defer x.End()
		}
		x.record("test", "ok", f, false)
	}
	record("llama3.2", true, nil)
	record("made-up-name", false, ModelNotFound("made-up-name"))
	record("llama3.2", false, StartFailure(&sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "llama3.2"}, nil, "llama3.2"))

	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"route", "openai_chat", "model", "llama3.2", "principal", "alice", "outcome", "ok"}, 1},
		{[]string{"model", "", "principal", "alice", "outcome", "model_not_found"}, 1},
		{[]string{"model", "llama3.2", "outcome", "queue_full"}, 1},
		{[]string{"model", "made-up-name"}, 0},
	} {
		if got := metricstest.Sum(t, m.Requests, c.labels...); got != c.want {
			t.Errorf("requests %q = %v, want %v", c.labels, got, c.want)
		}
	}
}

// The time to first token is observed by route and by the model the
// request was scheduled for.
func TestTimeToFirstTokenIsByRouteAndModel(t *testing.T) {
	m := testMetrics()
	x := NewExchange(httptest.NewRecorder(), httptest.NewRequest("POST", "/", nil), "ollama_chat", m, nil)
	x.model = "qwen3"
	x.Begin(time.Minute)
	defer x.End()
	x.Admitted()
	x.firstByte()
	if got := metricstest.Sum(t, m.TimeToFirstToken, "route", "ollama_chat", "model", "qwen3"); got != 1 {
		t.Errorf("time to first token observed %v times for ollama_chat, qwen3; want 1", got)
	}
}
