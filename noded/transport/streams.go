package transport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// headerTimeout bounds the wait for a dispatched stream's first frame.
const headerTimeout = 10 * time.Second

// acceptStreams accepts the Edge's dispatched streams until the connection
// ends, and serves each on its own goroutine bound to ctx.
func (c *Client) acceptStreams(ctx context.Context, conn *connection) {
	for {
		st, err := conn.qc.AcceptStream(ctx)
		if err != nil {
			return
		}
		c.inflight.add(1)
		go func() {
			defer c.inflight.add(-1)
			c.serveStream(ctx, conn, st)
		}()
	}
}

// serveStream reads the header of one dispatched stream, checks it belongs
// to this generation, and hands it to the handler.
func (c *Client) serveStream(ctx context.Context, conn *connection, raw *quic.Stream) {
	st := quicwire.NewStream(raw, "header")
	defer func() {
		// Finish both halves, or the Edge's stream slot is never freed.
		st.StopReading()
		_ = st.CloseSend()
	}()
	_ = raw.SetReadDeadline(time.Now().Add(headerTimeout))
	hdr := new(wirepb.StreamHeader)
	if err := st.Recv(hdr); err != nil {
		var pe *quicwire.ProtocolError
		if errors.As(err, &pe) {
			c.log.Warn("malformed stream header", "stream", raw.StreamID(), "err", err)
		}
		st.Cancel(quicwire.StreamProtocolError)
		return
	}
	_ = raw.SetReadDeadline(time.Time{})
	st.SetKind(quicwire.HeaderKind(hdr))
	switch {
	case hdr.GetGeneration() != conn.sess.Generation():
		// A stream bound to another generation is fenced (decision 6).
		c.log.Warn("refused stream of another generation", "stream_generation", hdr.GetGeneration(), "generation", conn.sess.Generation())
		st.Cancel(quicwire.StreamRefused)
		return
	case c.draining.Load():
		st.Cancel(quicwire.StreamShutdown)
		return
	case st.Kind() == "unknown":
		c.log.Warn("refused stream of unknown kind", "stream", raw.StreamID())
		st.Cancel(quicwire.StreamProtocolError)
		return
	case c.opts.Handler == nil:
		st.Cancel(quicwire.StreamRefused)
		return
	}
	c.opts.Handler.ServeStream(ctx, conn.sess, hdr, st)
}

// Drain stops taking new work, tells the Edge, waits for in-flight streams
// until ctx is done, and closes the connection with CloseShutdown. Run
// returns afterwards once its context is cancelled; Drain does not reconnect.
func (c *Client) Drain(ctx context.Context, reason string) error {
	c.draining.Store(true)
	c.mu.Lock()
	conn := c.current
	c.mu.Unlock()
	c.update(func(s *Status) { s.State = StateDraining })
	if conn == nil {
		return nil
	}
	deadline, _ := ctx.Deadline()
	_ = conn.cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_Drain{Drain: &wirepb.DrainNotice{
		Reason: reason, DeadlineUnixMs: deadline.UnixMilli(),
	}}})
	c.log.Info("draining", "in_flight", c.inflight.count(), "deadline", deadline)
	var err error
	select {
	case <-c.inflight.idle():
	case <-ctx.Done():
		err = fmt.Errorf("drain: %d streams still in flight: %w", c.inflight.count(), ctx.Err())
	}
	quicwire.CloseShutdown.Close(conn.qc, "node shutting down")
	return err
}

// InFlight is the number of dispatched streams being served.
func (c *Client) InFlight() int { return c.inflight.count() }

// inflight counts served streams and tells when none are left.
type inflight struct {
	mu     sync.Mutex
	n      int
	idleCh chan struct{} // closed while n == 0; nil means "idle, no channel yet"
}

func (f *inflight) add(d int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 && d > 0 {
		f.idleCh = make(chan struct{})
	}
	f.n += d
	if f.n == 0 && d < 0 {
		close(f.idleCh)
	}
}

func (f *inflight) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// idle returns a channel that is closed when no stream is in flight.
func (f *inflight) idle() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return f.idleCh
}
