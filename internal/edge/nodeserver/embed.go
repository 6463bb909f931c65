package nodeserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// EmbedStream is an embedding call dispatched to a Node, read to its end
// with Wait. It always ends in exactly one terminal: the Node's, or one it
// makes when the stream ends without one (disconnect, cancel, protocol
// error).
type EmbedStream struct {
	d    *Dispatched
	req  *wirepb.EmbedRequest
	ctx  context.Context
	stop func() bool

	// mu orders Abandon against the end: a call is abandoned only while
	// it has not ended.
	mu        sync.Mutex
	ended     bool
	abandoned error // why Abandon ended the call
}

// Embed dispatches req to nodeID's current ready generation. Cancelling ctx
// cancels the call on the Node (R10): it ends that call only.
func (s *Server) Embed(ctx context.Context, nodeID string, req *wirepb.EmbedRequest) (*EmbedStream, error) {
	d, err := s.Dispatch(ctx, nodeID, &wirepb.StreamHeader{Kind: &wirepb.StreamHeader_Embed{Embed: req}})
	if err != nil {
		return nil, err
	}
	// As for a run, the Edge sends nothing after the header but keeps its
	// half open: resetting it is how a cancel reaches the Node.
	e := &EmbedStream{d: d, req: req, ctx: ctx}
	e.stop = context.AfterFunc(ctx, func() { d.Cancel(quicwire.StreamCancelled) })
	return e, nil
}

// Generation is the Node generation the call was dispatched on.
func (e *EmbedStream) Generation() uint64 { return e.d.Conn.Generation() }

// Wait reads the call to its end and returns its vectors, in input order,
// and its terminal; the vectors only with a COMPLETED terminal. progress,
// if not nil, is called after each frame of vectors. A frame out of order,
// more vectors than inputs, vectors of different or zero lengths, a result
// past wirepb.MaxEmbedValues, or a COMPLETED terminal before one vector per
// input ends the call with a protocol failure.
func (e *EmbedStream) Wait(progress func()) ([]*wirepb.Vector, *wirepb.RunEvent) {
	var vectors []*wirepb.Vector
	inputs, values, dims := len(e.req.GetInputs()), 0, 0
	for {
		f := new(wirepb.EmbedFrame)
		err := e.d.Recv(f)
		e.mu.Lock()
		abandoned := e.abandoned
		e.mu.Unlock()
		switch {
		case abandoned != nil:
			// Whatever came in the meantime is dropped.
			return nil, e.end(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED,
				Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, Message: abandoned.Error(), Retryable: true}})
		case err == nil:
		case e.ctx.Err() != nil:
			return nil, e.end(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED})
		case busy(err):
			return nil, e.end(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, Failure: e.d.busyFailure()})
		case errors.Is(err, quicwire.ErrDisconnected):
			return nil, e.end(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED,
				Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, Message: err.Error(), Retryable: true}})
		case err == io.EOF:
			return nil, e.end(protocolFailure(errors.New("embed stream ended without a terminal")))
		default:
			return nil, e.end(protocolFailure(err))
		}
		switch fr := f.GetFrame().(type) {
		case *wirepb.EmbedFrame_Vectors:
			v := fr.Vectors
			if n := len(v.GetVectors()); int(v.GetFirst()) != len(vectors) || n == 0 || len(vectors)+n > inputs {
				return nil, e.end(protocolFailure(fmt.Errorf("a frame of %d vector(s) from index %d, after %d of %d", n, v.GetFirst(), len(vectors), inputs)))
			}
			for _, vec := range v.GetVectors() {
				n := len(vec.GetValues())
				if dims == 0 {
					dims = n
				}
				if values += n; n != dims || n == 0 || values > wirepb.MaxEmbedValues {
					return nil, e.end(protocolFailure(fmt.Errorf("vector %d has %d values (the first has %d; %d in all, at most %d)",
						len(vectors), n, dims, values, wirepb.MaxEmbedValues)))
				}
				if !finite(vec.GetValues()) {
					return nil, e.end(protocolFailure(fmt.Errorf("vector %d holds a value that is not a finite number", len(vectors))))
				}
				vectors = append(vectors, vec)
			}
			if progress != nil {
				progress()
			}
		case *wirepb.EmbedFrame_Terminal:
			ev := fr.Terminal
			switch t := ev.GetType(); {
			case !t.IsTerminal():
				return nil, e.end(protocolFailure(fmt.Errorf("a %v event as the terminal", t)))
			case t != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED:
				return nil, e.end(ev)
			case len(vectors) != inputs:
				return nil, e.end(protocolFailure(fmt.Errorf("completed with %d vector(s) for %d input(s)", len(vectors), inputs)))
			}
			return vectors, e.end(ev)
		default:
			return nil, e.end(protocolFailure(errors.New("an empty embed frame")))
		}
	}
}

// end records the terminal and finishes the stream, and hands a stall's
// observation or a completion to the registry's health overlay, as a run's
// end does.
func (e *EmbedStream) end(ev *wirepb.RunEvent) *wirepb.RunEvent {
	e.mu.Lock()
	e.ended = true
	e.mu.Unlock()
	e.stop()
	e.d.Finish()
	switch ev.GetType() {
	case wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED:
		e.d.observe(ev.GetStall())
	case wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED:
		e.d.srv.reg.ObserveCompleted(e.d.Conn, e.req.GetProvider(), e.req.GetTarget())
	}
	return ev
}

// Abandon gives up a call that has not ended, because of cause (its Node
// turned suspect, P4): the call is cancelled on the Node, and Wait yields a
// DISCONNECTED terminal whose failure says cause, so the work can move to
// another candidate (nothing of a call reaches the client before its end).
// It reports false, and does nothing, once the call has ended. Safe to
// call from any goroutine.
func (e *EmbedStream) Abandon(cause error) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ended || e.abandoned != nil {
		return false
	}
	e.abandoned = cause
	e.d.Cancel(quicwire.StreamCancelled)
	return true
}

// Abandoned reports whether Abandon ended the call.
func (e *EmbedStream) Abandoned() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.abandoned != nil
}

// finite reports whether every value is a finite number: JSON has no
// other.
func finite(values []float32) bool {
	for _, v := range values {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return false
		}
	}
	return true
}
