package edgeclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/shallow"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// headerTimeout bounds the wait for a dispatched stream's first frame.
const headerTimeout = 10 * time.Second

// acceptStreams accepts the Edge's dispatched streams until the connection
// ends, and serves each on its own goroutine bound to ctx. It returns once
// every handler it started has returned: ctx ends with the connection, and
// a handler returns promptly then (Handler), so the connection's end (and
// with it Run's, and the Node's Stop) waits for the work it carried to
// finish sending its terminals, never for a hung provider.
func (c *Client) acceptStreams(ctx context.Context, conn *connection) {
	var handlers sync.WaitGroup
	defer handlers.Wait()
	for {
		st, err := conn.qc.AcceptStream(ctx)
		if err != nil {
			return
		}
		c.inflight.Add(1)
		conn.streams.Add(1)
		handlers.Go(func() {
			defer conn.streams.Add(-1)
			defer c.inflight.Add(-1)
			c.serveStream(ctx, conn, st)
		})
	}
}

// serveStream reads the header of one dispatched stream, checks it belongs
// to this generation, and hands it to the handler.
func (c *Client) serveStream(ctx context.Context, conn *connection, raw *quic.Stream) {
	st := transport.NewStream(raw, "header")
	defer func() {
		// Finish both halves, or the Edge's stream slot is never freed.
		st.StopReading()
		_ = st.CloseSend()
	}()
	// The deadline follows the header's progress: one in parts (a request
	// as large as a session gets) takes a while on a slow link.
	extend := func() { _ = raw.SetReadDeadline(time.Now().Add(headerTimeout)) }
	extend()
	// The header's unmarshalling goes deep, and this goroutine may then
	// wait for minutes (a run in a prefill): it is read on a goroutine of
	// its own, so this one stays as small as its own frames (package
	// shallow, issue 25).
	var hdr *wirepb.StreamHeader
	var err error
	shallow.Call(func() { hdr, err = st.RecvHeader(c.opts.MaxRequest, extend) })
	if err != nil {
		var pe *transport.ProtocolError
		if errors.As(err, &pe) {
			c.log.Warn("malformed stream header", "stream", raw.StreamID(), "err", err)
		}
		st.Cancel(quicwire.StreamProtocolError)
		return
	}
	_ = raw.SetReadDeadline(time.Time{})
	st.SetKind(transport.HeaderKind(hdr))
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
	if conn.busyRefusals {
		ctx = WithBusyRefusals(ctx)
	}
	c.opts.Handler.ServeStream(ctx, conn.sess, hdr, st)
}

type busyRefusalsKey struct{}

// WithBusyRefusals returns ctx marked as BusyRefusals reads it. The Client
// marks the context of every stream from an Edge that reads StreamBusy;
// tests of a Handler mark their own.
func WithBusyRefusals(ctx context.Context) context.Context {
	return context.WithValue(ctx, busyRefusalsKey{}, true)
}

// BusyRefusals reports whether the Edge a stream came from reads
// quicwire.StreamBusy (RegisterResponse.busy_refusals), from the context
// ServeStream was given: a handler then refuses a call its provider has
// no slot for with that code, before the first byte, and otherwise with a
// CAPACITY_EXHAUSTED failure terminal, as before (issue 22).
func BusyRefusals(ctx context.Context) bool {
	ok, _ := ctx.Value(busyRefusalsKey{}).(bool)
	return ok
}

// Drain stops taking new work and tells the Edge, which stops dispatching
// and closes the connection with shutdown once it has read the outcome of
// every in-flight stream. If ctx ends first, Drain closes the connection
// itself (cutting what still runs) and says so. Run then returns once its
// context is cancelled; it does not reconnect.
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
	c.log.Info("draining", "in_flight", c.inflight.Load(), "deadline", deadline)
	err := conn.cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_Drain{Drain: &wirepb.DrainNotice{
		Reason: reason, DeadlineUnixMs: deadline.UnixMilli(),
	}}})
	if err == nil {
		select {
		case <-conn.qc.Context().Done():
			return nil
		case <-ctx.Done():
			err = fmt.Errorf("drain: %d streams still in flight: %w", c.inflight.Load(), ctx.Err())
		}
	}
	quicwire.CloseShutdown.Close(conn.qc, "node shutting down")
	return err
}

// InFlight is the number of dispatched streams being served.
func (c *Client) InFlight() int { return int(c.inflight.Load()) }
