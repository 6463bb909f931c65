package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
	"github.com/iop-dev/iop/sdk/pluginhost"
)

// Stream is the dispatched stream a run is served on: a *quicwire.Stream,
// whose errors it returns.
type Stream interface {
	Send(m proto.Message) error
	Recv(m proto.Message) error
}

// Causes that end a run early. Each maps to its own terminal type.
var (
	errCancelled    = errors.New("run cancelled by the edge")
	errDisconnected = errors.New("connection to the edge ended")
)

// runOut is a run's output side: it numbers events, and owns the single
// terminal (ARCHITECTURE.md decision 5): the first claim wins and nothing
// is sent after it.
type runOut struct {
	st  Stream
	req *wirepb.RunRequest

	mu       sync.Mutex
	seq      uint64
	terminal *wirepb.RunEvent
}

// emit sends one non-terminal event. After the terminal it refuses, which
// makes the adapter stop.
func (o *runOut) emit(ev *wirepb.RunEvent) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.terminal != nil {
		return fmt.Errorf("run %s already ended (%s)", o.req.GetRunId(), o.terminal.GetType())
	}
	if isTerminal(ev.GetType()) {
		return fmt.Errorf("adapter sent a terminal event (%s) as progress", ev.GetType())
	}
	return o.sendLocked(ev)
}

// finish claims the terminal and sends it; only the first call does
// anything. It reports whether this call was the one.
func (o *runOut) finish(ev *wirepb.RunEvent) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.terminal != nil {
		return false
	}
	o.terminal = ev
	_ = o.sendLocked(ev)
	return true
}

func (o *runOut) sendLocked(ev *wirepb.RunEvent) error {
	o.seq++
	ev.Seq = o.seq
	ev.RunId, ev.SessionId = o.req.GetRunId(), o.req.GetSessionId()
	return o.st.Send(ev)
}

func isTerminal(t wirepb.RunEventType) bool {
	return t >= wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED
}

func failed(kind wirepb.FailureKind, format string, args ...any) *wirepb.RunEvent {
	return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
		Failure: &wirepb.Failure{Kind: kind, Message: fmt.Sprintf(format, args...)}}
}

// serveRun executes one normalized run (R2): validate, admit, run the
// adapter under the stall watchdog (R5), and end with exactly one terminal.
// sess is the connection's session, nil for a path without one.
func (h *Handler) serveRun(ctx context.Context, sess *quicwire.Session, req *wirepb.RunRequest, st Stream) {
	out := &runOut{st: st, req: req}
	log := h.log.With("run_id", req.GetRunId(), "target", req.GetTarget())

	// R4: an invalid raw stall timeout is refused before any provider
	// lookup or adapter call.
	stall, err := StallTimeout(req.GetResponseStallTimeoutMs())
	if err != nil {
		out.finish(failed(wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST, "%v", err))
		return
	}
	prov, err := h.set.Lookup(req.GetProvider(), req.GetAdapter(), req.GetTarget())
	if err != nil {
		out.finish(failed(wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND, "%v", err))
		return
	}
	plugin, release, err := prov.Acquire()
	switch {
	case errors.Is(err, ErrCapacityExhausted):
		out.finish(failed(wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED, "%v", err))
		return
	case err != nil:
		out.finish(failed(wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, "%v", err))
		return
	}

	// R11: the lease is opened after admission, immediately before the
	// provider call; a refusal ends the run without one (S4).
	cred, refused := h.openLease(sess, req.GetSealedLease(), req.GetBinding(), prov.Name(), req.GetTarget())
	if refused != nil {
		release()
		out.finish(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, Failure: refused})
		return
	}
	req.SealedLease = nil // the adapter gets the credential, not the lease

	// The call's context ends with the connection, the hard deadline, the
	// Edge's cancel or a stall, whichever comes first; the guard claims
	// the outcome once.
	g := h.newGuard(ctx, guardSpec{sess: sess, prov: prov, plugin: plugin, target: req.GetTarget(),
		stall: stall, deadlineMs: req.GetDeadlineUnixMs()})
	go watchCancel(st, g.stop)

	start := time.Now()
	emit := func(ev *wirepb.RunEvent) error {
		return g.wd.Emit(RunEventIsProgress(ev), func() error { return out.emit(ev) })
	}
	// The call runs on its own goroutine so that a stall can end the run
	// while the call is still stuck. ret is written before callDone closes.
	var ret struct {
		term  *wirepb.RunEvent
		claim string
	}
	callDone := make(chan struct{})
	g.wd.Start()
	go func() {
		defer close(callDone)
		result, err := plugin.Execute(g.ctx, req, cred, emit)
		g.wd.CallReturned()
		ret.term = outcome(ctx, g.ctx, result, err)
		ret.claim = g.settle(runClaim(ret.term))
	}()
	defer g.releaseAfter(callDone, release)

	var term *wirepb.RunEvent
	select {
	case <-callDone:
		if ret.claim != CauseStalled {
			term = ret.term
			if earlyEnd(ret.claim) && ret.claim != runClaim(ret.term) {
				term = runTerminal(ret.claim)
			}
		}
	case <-g.wd.Stalled():
	}
	if term == nil {
		if obs := g.wd.Finish(); obs != nil {
			term = &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED, Stall: obs}
			log.Warn("run stalled", "stall", stallMessage(obs), "seq", obs.GetHealthObservationSeq(),
				"retryable", obs.GetRetryable(), "fenced_events", g.wd.Dropped())
		} else {
			<-callDone // a deadline or disconnect took the outcome at the same instant
			term = runTerminal(g.wd.Winner())
		}
	}
	if out.finish(term) {
		log.Info("run ended", "outcome", term.GetType().String(), "failure", term.GetFailure().GetKind().String(), "took", time.Since(start))
	}
}

// runClaim is the claim a run's terminal makes.
func runClaim(ev *wirepb.RunEvent) string {
	switch ev.GetType() {
	case wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED:
		return CauseCompleted
	case wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED:
		return CauseCancelled
	case wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED:
		return CauseDeadline
	case wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED:
		return CauseDisconnected
	}
	return CauseFailed
}

// watchCancel reads the run stream, on which the Edge sends nothing after
// the header: a cancel of the stream (R10) cancels the run.
func watchCancel(st Stream, cancel func(error)) {
	var sc *quicwire.StreamCancelledError
	for {
		err := st.Recv(new(wirepb.RunEvent))
		switch {
		case err == nil:
			continue // nothing is expected; ignore
		case errors.As(err, &sc):
			cancel(errCancelled)
		case errors.Is(err, quicwire.ErrDisconnected):
			cancel(errDisconnected)
		case err == io.EOF:
		default:
			cancel(err)
		}
		return
	}
}

// outcome turns how Execute ended into the run's terminal event. The cause
// that ended the run context wins over what the adapter returned after it.
func outcome(conn, rctx context.Context, result *sdk.Result, err error) *wirepb.RunEvent {
	switch {
	case conn.Err() != nil || errors.Is(context.Cause(rctx), errDisconnected):
		return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED}
	case errors.Is(context.Cause(rctx), errCancelled):
		return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED}
	case errors.Is(rctx.Err(), context.DeadlineExceeded):
		return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED}
	case err != nil:
		return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, Failure: pluginhost.FailureToWire(err)}
	}
	ev := &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED}
	if result != nil {
		ev.DoneReason, ev.Usage = result.DoneReason, pluginhost.UsageToWire(result.Usage)
	}
	return ev
}
