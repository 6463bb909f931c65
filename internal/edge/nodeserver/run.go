package nodeserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// RunStream is a normalized run dispatched to a Node (R2), read event by
// event. It always yields exactly one terminal event: the Node's, or one
// it makes when the stream ends without one (disconnect, cancel, protocol
// error).
type RunStream struct {
	d       *Dispatched
	req     *wirepb.RunRequest
	ctx     context.Context
	stop    func() bool
	lastSeq uint64
	ended   bool

	// mu orders Abandon against the first event: a run is abandoned only
	// while it has produced nothing.
	mu        sync.Mutex
	produced  bool  // Next has returned an event
	abandoned error // why Abandon ended the run
}

// Run dispatches req to nodeID's current ready generation. Cancelling ctx
// cancels the run on the Node (R10): it ends that run only.
func (s *Server) Run(ctx context.Context, nodeID string, req *wirepb.RunRequest) (*RunStream, error) {
	d, err := s.Dispatch(ctx, nodeID, &wirepb.StreamHeader{Kind: &wirepb.StreamHeader_Run{Run: req}})
	if err != nil {
		return nil, err
	}
	// The Edge sends nothing after the header but keeps its half open:
	// resetting it is how a cancel reaches the Node even during a silent
	// prefill, when the Node is not writing.
	r := &RunStream{d: d, req: req, ctx: ctx}
	r.stop = context.AfterFunc(ctx, func() { d.Cancel(quicwire.StreamCancelled) })
	return r, nil
}

// Ready reports whether the next event has already arrived whole, so
// that Next returns it without waiting: a relay then writes it before it
// flushes, one flush for both. Call it from the goroutine that calls Next.
func (r *RunStream) Ready() bool { return !r.ended && r.d.Ready() }

// Generation is the Node generation the run was dispatched on.
func (r *RunStream) Generation() uint64 { return r.d.Conn.Generation() }

// Next returns the next event of the run. After the terminal event it
// returns io.EOF.
func (r *RunStream) Next() (*wirepb.RunEvent, error) {
	if r.ended {
		return nil, io.EOF
	}
	ev := new(wirepb.RunEvent)
	err := r.d.Recv(ev)
	r.mu.Lock()
	abandoned := r.abandoned
	r.produced = r.produced || abandoned == nil
	r.mu.Unlock()
	switch {
	case abandoned != nil:
		// Whatever came in the meantime is dropped: the run was given up
		// before anything of it was used.
		return r.end(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, Message: abandoned.Error(), Retryable: true}}), nil
	case err == nil && ev.GetSeq() <= r.lastSeq:
		return r.end(protocolFailure(fmt.Errorf("event seq %d after %d", ev.GetSeq(), r.lastSeq))), nil
	case err == nil:
		r.lastSeq = ev.GetSeq()
		if ev.GetType().IsTerminal() {
			return r.end(ev), nil
		}
		return ev, nil
	case r.ctx.Err() != nil:
		return r.end(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED}), nil
	case busy(err):
		return r.end(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, Failure: r.d.busyFailure()}), nil
	case errors.Is(err, quicwire.ErrDisconnected):
		return r.end(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, Message: err.Error(), Retryable: true}}), nil
	case err == io.EOF:
		return r.end(protocolFailure(errors.New("run stream ended without a terminal event"))), nil
	default:
		return r.end(protocolFailure(err)), nil
	}
}

func protocolFailure(err error) *wirepb.RunEvent {
	return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
		Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROTOCOL, Message: err.Error()}}
}

// end records the terminal and finishes the stream.
func (r *RunStream) end(ev *wirepb.RunEvent) *wirepb.RunEvent {
	r.ended = true
	r.stop()
	r.d.Finish()
	switch ev.GetType() {
	case wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED:
		r.d.observe(ev.GetStall())
	case wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED:
		r.d.srv.reg.ObserveCompleted(r.d.Conn, r.req.GetProvider(), r.req.GetTarget())
	}
	return ev
}

// Abandon gives up a run that has produced nothing yet, because of cause
// (its Node turned suspect, P4): the run is cancelled on the Node, and
// Next yields a DISCONNECTED terminal whose failure says cause, so the
// work can move to another candidate. It reports false, and does nothing,
// once Next has returned an event. Safe to call from any goroutine.
func (r *RunStream) Abandon(cause error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.produced || r.abandoned != nil {
		return false
	}
	r.abandoned = cause
	r.d.Cancel(quicwire.StreamCancelled)
	return true
}

// Abandoned reports whether Abandon ended the run.
func (r *RunStream) Abandoned() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.abandoned != nil
}

// Close abandons the run if it has not ended (cancelling it on the Node).
func (r *RunStream) Close() {
	if !r.ended {
		r.ended = true
		r.stop()
		r.d.Cancel(quicwire.StreamCancelled)
	}
}

// Command sends one command (R10) to nodeID and returns its result.
func (s *Server) Command(ctx context.Context, nodeID string, cmd *wirepb.CommandRequest) (*wirepb.CommandResult, error) {
	d, err := s.Dispatch(ctx, nodeID, &wirepb.StreamHeader{Kind: &wirepb.StreamHeader_Command{Command: cmd}})
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { d.Cancel(quicwire.StreamCancelled) })
	defer stop()
	_ = d.CloseSend()
	res := new(wirepb.CommandResult)
	if err := d.Recv(res); err != nil {
		d.Cancel(quicwire.StreamCancelled)
		return nil, fmt.Errorf("command %s on %s: %w", cmd.GetKind(), nodeID, err)
	}
	d.Finish()
	return res, nil
}
