package frontendtest

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// work is what runs and tunnels share: their context, cancels and close.
type work struct {
	id, model string
	ctx       context.Context
	cancel    context.CancelCauseFunc
	stop      context.CancelFunc

	mu        sync.Mutex
	cancels   []error
	closeOnce sync.Once
	closed    chan struct{}
}

func (w *work) ID() string               { return w.id }
func (w *work) Context() context.Context { return w.ctx }
func (w *work) Node() sched.Candidate {
	return sched.Candidate{NodeID: "n1", Provider: "p1", Adapter: "ollama", Target: w.model}
}

func (w *work) Cancel(cause error) {
	w.mu.Lock()
	w.cancels = append(w.cancels, cause)
	w.mu.Unlock()
	w.cancel(cause)
}

func (w *work) Close() {
	w.closeOnce.Do(func() {
		w.stop()
		w.cancel(context.Canceled)
		close(w.closed)
	})
}

// Closed is closed once the front end closed the work.
func (w *work) Closed() <-chan struct{} { return w.closed }

// CancelledWith reports whether the work was cancelled with cause.
func (w *work) CancelledWith(cause error) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.cancels {
		if errors.Is(c, cause) {
			return true
		}
	}
	return false
}

// wait gives s after its delay or gate; false when the work's context
// ended first.
func (w *work) wait(s Step) bool {
	var after <-chan time.Time
	if s.Delay > 0 {
		after = time.After(s.Delay)
	}
	if s.Gate == nil && after == nil {
		return w.ctx.Err() == nil
	}
	select {
	case <-s.Gate:
	case <-after:
	case <-w.ctx.Done():
		return false
	}
	return true
}

// Run plays its steps; Next is only called by the relaying goroutine,
// Cancel from anywhere.
type Run struct {
	work
	steps []Step
	done  bool
}

var _ frontend.Run = (*Run)(nil)

// Next gives the next step's event, or the CANCELLED terminal the
// transport makes when the run's context ends.
func (r *Run) Next() (*wirepb.RunEvent, error) {
	if r.done {
		return nil, io.EOF
	}
	if len(r.steps) > 0 {
		s := r.steps[0]
		r.steps = r.steps[1:]
		if !r.wait(s) {
			return r.cancelled(), nil
		}
		r.done = s.Event.GetType().IsTerminal()
		return s.Event, nil
	}
	<-r.ctx.Done()
	return r.cancelled(), nil
}

func (r *Run) cancelled() *wirepb.RunEvent {
	r.done = true
	return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED}
}

// Ready is false: every event is flushed as it comes.
func (r *Run) Ready() bool { return false }

// Tunnel plays its pieces; NextPiece is only called by the relaying goroutine,
// Cancel from anywhere.
type Tunnel struct {
	work
	head   *wirepb.TunnelResponseHead
	pieces []Step
	end    error
	silent bool
	err    error // once the body has ended

	umu   sync.Mutex
	usage [][2]int64
}

var _ frontend.Tunnel = (*Tunnel)(nil)

func (t *Tunnel) Head() *wirepb.TunnelResponseHead { return t.head }

// Ready is false: each piece is played in its own time.
func (t *Tunnel) Ready() bool { return false }

// NextPiece plays the next piece that has bytes, or ends the body.
func (t *Tunnel) NextPiece() ([]byte, error) {
	for t.err == nil {
		var p []byte
		if p, t.err = t.next(); len(p) > 0 {
			return p, nil
		}
	}
	return nil, t.err
}

// next plays the next piece, or ends the body.
func (t *Tunnel) next() ([]byte, error) {
	if t.ctx.Err() != nil {
		return nil, t.cancelled()
	}
	if len(t.pieces) == 0 {
		switch {
		case t.silent:
			<-t.ctx.Done()
			return nil, t.cancelled()
		case t.end != nil:
			return nil, t.end
		}
		return nil, io.EOF
	}
	s := t.pieces[0]
	t.pieces = t.pieces[1:]
	if !t.wait(s) {
		return nil, t.cancelled()
	}
	return []byte(s.Data), nil
}

// cancelled is the terminal the transport makes when the tunnel's context
// ends.
func (t *Tunnel) cancelled() error {
	return &nodeserver.TunnelError{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED, Err: context.Cause(t.ctx)}
}

// CountUsage records the usage the front end counted.
func (t *Tunnel) CountUsage(prompt, completion int64) {
	t.umu.Lock()
	defer t.umu.Unlock()
	t.usage = append(t.usage, [2]int64{prompt, completion})
}

// Counted is every CountUsage call: prompt, completion.
func (t *Tunnel) Counted() [][2]int64 {
	t.umu.Lock()
	defer t.umu.Unlock()
	return slices.Clone(t.usage)
}
