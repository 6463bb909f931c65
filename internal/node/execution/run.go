package execution

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/node/nodemetrics"
	"github.com/iop-dev/iop/internal/shallow"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// Stream is the dispatched stream a run is served on: a *transport.Stream,
// whose errors it returns.
type Stream interface {
	Send(m proto.Message) error
	Recv(m proto.Message) error
}

// runOut is a run's output side: it numbers events, and sends the single
// terminal (ARCHITECTURE.md decision 5, outcome.go): nothing is sent after
// it.
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
	if ev.GetType().IsTerminal() {
		return fmt.Errorf("adapter sent a terminal event (%s) as progress", ev.GetType())
	}
	return o.sendLocked(ev)
}

// finish sends the terminal; only the first call does anything. It
// reports whether this call was the one.
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

// serveRun executes one normalized run (R2): validate, admit, run the
// adapter under the stall watchdog (R5), and end with exactly one terminal.
// sess is the connection's session, nil for a path without one.
func (h *Handler) serveRun(ctx context.Context, sess *transport.Session, req *wirepb.RunRequest, st Stream) {
	out := &runOut{st: st, req: req}
	log := h.callLog(slog.String("run_id", req.GetRunId()), slog.String("target", req.GetTarget()))

	capability := ""
	switch {
	case req.GetCountTokens():
		capability = sdk.CapCountTokens // counted, never run
	case req.GetCompletion() != nil:
		capability = sdk.CapComplete // never run as a chat: it has no messages
	}
	// The admission goes deep (the lease's opening), and this goroutine
	// then waits for the run's events, through a prefill for minutes: it
	// runs on a goroutine of its own (package shallow, as serveTunnel's).
	var (
		a       *admitted
		refused *wirepb.Failure
	)
	shallow.Call(func() {
		a, refused = h.admit(sess, admission{kind: nodemetrics.Run, stallMs: req.GetResponseStallTimeoutMs(), provider: req.GetProvider(), adapter: req.GetAdapter(),
			target: req.GetTarget(), capability: capability, sealed: req.GetSealedLease(), binding: req.GetBinding()})
	})
	if refused != nil {
		if h.refuseBusy(ctx, st, refused, req.GetProvider(), req.GetAdapter(), req.GetTarget()) {
			return
		}
		out.finish(refusedOutcome(refused).RunEvent())
		return
	}
	req.SealedLease = nil // the adapter gets the credential, not the lease

	g := a.guard(ctx, h, sess, req.GetTarget(), req.GetDeadlineUnixMs(), st)

	start := time.Now()
	emit := func(ev *wirepb.RunEvent) error {
		return g.wd.Emit(RunEventIsProgress(ev), func() error { return out.emit(ev) })
	}
	g.serve(log, a.release, func() (Outcome, error) { return pluginOutcome(a.plugin.Execute(g.ctx, req, a.cred, emit)) }, func(o Outcome) {
		if term := o.RunEvent(); out.finish(term) {
			log.Info("run ended", "outcome", o.Cause.String(), "failure", term.GetFailure().GetKind().String(), "took", time.Since(start))
		}
		h.ended(nodemetrics.Run, a.prov, o)
	})
}

// pluginOutcome is the outcome of a plugin call that returned its own
// terminal (see Plugin.Execute), or an error.
func pluginOutcome(term *wirepb.RunEvent, err error) (Outcome, error) {
	if err != nil || term == nil {
		return Outcome{}, err
	}
	return outcomeOfRunEvent(term), nil
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
