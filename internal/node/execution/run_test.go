package execution

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// onlineSet returns a set with one online provider "p" (target "m") whose
// plugin is pl.
func onlineSet(t testing.TB, capacity int, pl Plugin) (*Set, *Handler) {
	t.Helper()
	set, _, h := startSet(t, ProviderConfig{Name: "p", Adapter: "fake", Targets: []string{"m"}, Capacity: capacity}, pl, HandlerOptions{})
	return set, h
}

// startSet runs a set of one provider of cfg whose plugin is pl until the
// test ends, and returns it online, with a Handler over it with opts.
func startSet(t testing.TB, cfg ProviderConfig, pl Plugin, opts HandlerOptions) (*Set, *Provider, *Handler) {
	t.Helper()
	set := NewSet()
	cfg.Launch = func(context.Context) (Plugin, error) { return pl, nil }
	prov := NewProvider(cfg, DefaultSupervision, discard(), set.Notify)
	set.Add(prov)
	set.Start()
	t.Cleanup(set.Stop)
	if err := set.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	return set, prov, NewHandler(set, discard(), opts)
}

func run(id string) *wirepb.RunRequest { return &wirepb.RunRequest{RunId: id, Target: "m"} }

func text(s string) *wirepb.RunEvent {
	return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: s}
}

// requireOneTerminal checks seq order and that exactly the last event is
// terminal, and returns it.
func requireOneTerminal(t *testing.T, evs []*wirepb.RunEvent) *wirepb.RunEvent {
	t.Helper()
	if len(evs) == 0 {
		t.Fatal("no events")
	}
	for i, ev := range evs {
		if ev.GetSeq() != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.GetSeq())
		}
		if ev.GetType().IsTerminal() != (i == len(evs)-1) {
			t.Fatalf("terminal at %d of %d: %v", i, len(evs), evs)
		}
	}
	return evs[len(evs)-1]
}

// R2: events arrive in order, numbered, with run and session ids, and end
// with exactly one terminal carrying the adapter's result.
func TestRunStreamsOrderedEventsEndingInOneTerminal(t *testing.T) {
	pl := newFakePlugin(func(ctx context.Context, req *wirepb.RunRequest, emit func(*wirepb.RunEvent) error) (*sdk.Result, error) {
		for _, s := range []string{"a", "b", "c"} {
			if err := emit(text(s)); err != nil {
				return nil, err
			}
		}
		return &sdk.Result{DoneReason: "stop", Usage: &sdk.Usage{PromptTokens: 3, CompletionTokens: 3}}, nil
	})
	_, h := onlineSet(t, 1, pl)
	st := newFakeStream()
	req := run("r1")
	req.SessionId = "s1"
	serve(h, t.Context(), req, st)
	evs := st.events()
	term := requireOneTerminal(t, evs)
	if term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED || term.GetDoneReason() != "stop" || term.GetUsage().GetCompletionTokens() != 3 {
		t.Errorf("terminal = %v", term)
	}
	for _, ev := range evs {
		if ev.GetRunId() != "r1" || ev.GetSessionId() != "s1" {
			t.Errorf("event without its run/session ids: %v", ev)
		}
	}
}

// R4: an invalid raw stall timeout is refused before any adapter call; 0
// is valid (the default).
func TestInvalidStallTimeoutNeverReachesTheAdapter(t *testing.T) {
	pl := newFakePlugin(func(context.Context, *wirepb.RunRequest, func(*wirepb.RunEvent) error) (*sdk.Result, error) {
		return &sdk.Result{}, nil
	})
	_, h := onlineSet(t, 1, pl)
	for _, ms := range []int64{-1, MaxStallTimeoutMillis + 1} {
		st := newFakeStream()
		req := run("bad")
		req.ResponseStallTimeoutMs = ms
		serve(h, t.Context(), req, st)
		term := requireOneTerminal(t, st.events())
		if term.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST {
			t.Errorf("stall timeout %d: %v, want invalid_request", ms, term)
		}
	}
	if pl.calls.Load() != 0 {
		t.Fatalf("adapter called %d times for invalid stall timeouts", pl.calls.Load())
	}
	if d, err := StallTimeout(0); err != nil || d != 300*time.Second {
		t.Errorf("StallTimeout(0) = %v, %v; want 300s", d, err)
	}
}

// Over capacity, a run is refused at once with capacity_exhausted; the
// adapter is not called for it.
func TestOverCapacityIsRefusedAtOnce(t *testing.T) {
	started, finish := make(chan struct{}, 2), make(chan struct{})
	pl := newFakePlugin(func(ctx context.Context, _ *wirepb.RunRequest, _ func(*wirepb.RunEvent) error) (*sdk.Result, error) {
		started <- struct{}{}
		<-finish
		return &sdk.Result{}, nil
	})
	_, h := onlineSet(t, 1, pl)
	done := make(chan struct{})
	go func() { serve(h, t.Context(), run("busy"), newFakeStream()); close(done) }()
	<-started
	st := newFakeStream()
	serve(h, t.Context(), run("over"), st)
	if term := requireOneTerminal(t, st.events()); term.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED {
		t.Errorf("over capacity: %v", term)
	}
	close(finish)
	<-done
	if pl.calls.Load() != 1 {
		t.Errorf("adapter called %d times for one admitted run, want 1", pl.calls.Load())
	}
	// The slot is free again (finish is closed: the next run completes).
	st = newFakeStream()
	serve(h, t.Context(), run("after"), st)
	if term := requireOneTerminal(t, st.events()); term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
		t.Errorf("run after the slot freed: %v", term)
	}
}

// R10: a cancel of the run stream cancels the adapter's context and ends
// the run with one CANCELLED terminal.
func TestCancelEndsTheRunWithCancelled(t *testing.T) {
	pl := newFakePlugin(func(ctx context.Context, _ *wirepb.RunRequest, emit func(*wirepb.RunEvent) error) (*sdk.Result, error) {
		emit(text("x"))
		<-ctx.Done()
		return nil, ctx.Err()
	})
	_, h := onlineSet(t, 1, pl)
	st := newFakeStream()
	go func() {
		for len(st.events()) == 0 {
			time.Sleep(time.Millisecond)
		}
		st.cancel()
	}()
	serve(h, t.Context(), run("c"), st)
	// The terminal cannot be sent on a cancelled stream; what was sent
	// before it is intact, and nothing follows.
	if evs := st.events(); len(evs) != 1 || evs[0].GetText() != "x" {
		t.Errorf("events = %v", evs)
	}
}

// The hard deadline ends a run with DEADLINE_EXCEEDED.
func TestDeadlineEndsTheRunWithDeadlineExceeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pl := newFakePlugin(func(ctx context.Context, _ *wirepb.RunRequest, _ func(*wirepb.RunEvent) error) (*sdk.Result, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
		_, h := onlineSet(t, 1, pl)
		st := newFakeStream()
		req := run("d")
		req.DeadlineUnixMs = time.Now().Add(2 * time.Second).UnixMilli()
		start := time.Now()
		serve(h, t.Context(), req, st)
		if term := requireOneTerminal(t, st.events()); term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED {
			t.Errorf("terminal = %v", term)
		}
		if took := time.Since(start); took != 2*time.Second {
			t.Errorf("deadline hit after %v, want 2s", took)
		}
	})
}

// An adapter error becomes one FAILED terminal with its kind.
func TestAdapterErrorsKeepTheirKind(t *testing.T) {
	for _, c := range []struct {
		err  error
		want wirepb.FailureKind
	}{
		{sdk.Errorf(sdk.KindRateLimited, "slow down"), wirepb.FailureKind_FAILURE_KIND_RATE_LIMITED},
		{sdk.Errorf(sdk.KindModelNotFound, "no such model"), wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND},
		{sdk.Errorf(sdk.KindUnavailable, "plugin exited"), wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE},
		{errTest, wirepb.FailureKind_FAILURE_KIND_INTERNAL},
	} {
		pl := newFakePlugin(func(context.Context, *wirepb.RunRequest, func(*wirepb.RunEvent) error) (*sdk.Result, error) {
			return nil, c.err
		})
		_, h := onlineSet(t, 1, pl)
		st := newFakeStream()
		serve(h, t.Context(), run("e"), st)
		if term := requireOneTerminal(t, st.events()); term.GetFailure().GetKind() != c.want {
			t.Errorf("%v: terminal %v, want %v", c.err, term, c.want)
		}
	}
}

// An adapter that tries to send a terminal as progress is refused: the run
// still has exactly one terminal, the Node's.
func TestAdapterCannotSendATerminal(t *testing.T) {
	pl := newFakePlugin(func(ctx context.Context, _ *wirepb.RunRequest, emit func(*wirepb.RunEvent) error) (*sdk.Result, error) {
		if err := emit(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED}); err == nil {
			return nil, errors.New("terminal accepted as progress")
		}
		return &sdk.Result{DoneReason: "stop"}, nil
	})
	_, h := onlineSet(t, 1, pl)
	st := newFakeStream()
	serve(h, t.Context(), run("t"), st)
	if term := requireOneTerminal(t, st.events()); term.GetDoneReason() != "stop" {
		t.Errorf("terminal = %v", term)
	}
}

// A run for a target no provider serves fails without calling any adapter.
func TestUnknownTargetFails(t *testing.T) {
	pl := newFakePlugin(func(context.Context, *wirepb.RunRequest, func(*wirepb.RunEvent) error) (*sdk.Result, error) {
		return &sdk.Result{}, nil
	})
	_, h := onlineSet(t, 1, pl)
	st := newFakeStream()
	serve(h, t.Context(), &wirepb.RunRequest{RunId: "u", Target: "nope"}, st)
	if term := requireOneTerminal(t, st.events()); term.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND {
		t.Errorf("terminal = %v", term)
	}
	if pl.calls.Load() != 0 {
		t.Error("adapter called for an unknown target")
	}
}

// serve runs one run the way the transport does: the stream's reading half
// is finished after the handler returns.
func serve(h *Handler, ctx context.Context, req *wirepb.RunRequest, st *fakeStream) {
	defer st.cancel()
	h.serveRun(ctx, nil, req, st)
}

// Issue 22: the Node's slots are shared by every Edge it is connected to.
// Over capacity, a run from an Edge that reads the busy stream code is
// refused with it, before its first byte (no event at all), and counted;
// from an Edge that does not, it ends with a capacity_exhausted terminal
// as before.
func TestOverCapacityIsRefusedBusyBeforeTheFirstByte(t *testing.T) {
	started, finish := make(chan struct{}, 1), make(chan struct{})
	pl := newFakePlugin(func(ctx context.Context, _ *wirepb.RunRequest, _ func(*wirepb.RunEvent) error) (*sdk.Result, error) {
		started <- struct{}{}
		<-finish
		return &sdk.Result{}, nil
	})
	set, h := onlineSet(t, 1, pl)
	done := make(chan struct{})
	go func() { serve(h, t.Context(), run("holds"), newFakeStream()); close(done) }()
	<-started
	defer func() { close(finish); <-done }()

	st := &cancellableStream{fakeStream: newFakeStream()}
	h.serveRun(edgeclient.WithBusyRefusals(t.Context()), nil, run("over"), st)
	st.cancel()
	if st.code != quicwire.StreamBusy || len(st.events()) != 0 {
		t.Errorf("over capacity from a busy-reading Edge: stream cancelled with %v after %d events, want busy before any", st.code, len(st.events()))
	}
	if n := set.Providers()[0].BusyRefusals(); n != 1 {
		t.Errorf("busy refusals counted %d, want 1", n)
	}
	old := &cancellableStream{fakeStream: newFakeStream()}
	h.serveRun(t.Context(), nil, run("over-old"), old)
	old.cancel()
	if term := requireOneTerminal(t, old.events()); old.code != 0 || term.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED {
		t.Errorf("over capacity from an older Edge: code %v, terminal %v", old.code, term)
	}
}

// cancellableStream records the code a handler cancels it with.
type cancellableStream struct {
	*fakeStream
	code quicwire.StreamCode
}

func (s *cancellableStream) Cancel(code quicwire.StreamCode) { s.code = code }
