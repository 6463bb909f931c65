package transport

import (
	"errors"
	"io"
	"sync"

	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Stream is one framed QUIC stream: the control stream or a dispatched
// run, tunnel or command stream. Recv must be called from one goroutine at a
// time and Send from one goroutine at a time (they may run concurrently with
// each other); ControlStream adds a lock for several writers.
//
// Errors are translated so callers can branch on them: a *ProtocolError for
// malformed frames (the stream is then cancelled with StreamProtocolError),
// a *StreamCancelledError when either side cancelled the stream, and a
// *ConnClosedError (errors.Is ErrDisconnected) when the connection ended.
type Stream struct {
	st   *quic.Stream
	kind string
	r    *FrameReader
	w    *FrameWriter
}

// NewStream frames st with the size limit of its kind ("control" uses
// MaxControlFrameSize; everything else MaxStreamFrameSize).
func NewStream(st *quic.Stream, kind string) *Stream {
	limit := quicwire.MaxStreamFrameSize
	if kind == "control" {
		limit = quicwire.MaxControlFrameSize
	}
	return &Stream{st: st, kind: kind, r: NewFrameReader(st, limit, kind), w: NewFrameWriter(st, limit)}
}

// SetKind renames the stream once its first frame says what it is.
func (s *Stream) SetKind(kind string) { s.kind = kind; s.r.stream = kind }

// Kind is the stream's kind, as used in errors and logs.
func (s *Stream) Kind() string { return s.kind }

// ID is the QUIC stream id.
func (s *Stream) ID() quic.StreamID { return s.st.StreamID() }

// Recv reads the next frame into m. It returns io.EOF when the peer
// finished its side cleanly between frames.
func (s *Stream) Recv(m proto.Message) error {
	err := s.r.Read(m)
	if err == nil || err == io.EOF {
		return err
	}
	var pe *ProtocolError
	if errors.As(err, &pe) {
		s.Cancel(quicwire.StreamProtocolError)
		return err
	}
	return translate(err)
}

// Ready reports whether a whole frame has already arrived, so that Recv
// returns it without waiting (see FrameReader.Ready). Call it from the
// goroutine that calls Recv.
func (s *Stream) Ready() bool { return s.r.Ready() }

// Next returns the encoded message of the next frame when it has already
// arrived whole, without consuming it; nil otherwise (see
// FrameReader.Next). Call it from the goroutine that calls Recv.
func (s *Stream) Next() []byte { return s.r.Next() }

// Send writes m as one frame. A message over the stream's limit is refused
// before anything is written (errors.Is ErrFrameTooLarge).
func (s *Stream) Send(m proto.Message) error { return s.SendFrames(m) }

// SendFrames writes ms, one frame each, in a single write: they leave
// together (see FrameWriter.WriteFrames). If any is over the limit,
// nothing is written.
func (s *Stream) SendFrames(ms ...proto.Message) error {
	if err := s.w.WriteFrames(ms...); err != nil {
		if errors.Is(err, ErrFrameTooLarge) {
			return err
		}
		return translate(err)
	}
	return nil
}

// CloseSend finishes this side's half of the stream (FIN).
func (s *Stream) CloseSend() error { return translate(s.st.Close()) }

// Cancel abandons both halves of the stream with code. It is how a run or
// tunnel is cancelled (R10): it ends this stream only.
func (s *Stream) Cancel(code quicwire.StreamCode) {
	s.st.CancelRead(quic.StreamErrorCode(code))
	s.st.CancelWrite(quic.StreamErrorCode(code))
}

// StopReading tells the peer this side reads no more. Every stream must be
// finished on both halves, or the peer's stream slot is never freed.
func (s *Stream) StopReading() { s.st.CancelRead(quic.StreamErrorCode(quicwire.StreamDone)) }

// Raw returns the underlying QUIC stream, for deadlines and priority.
func (s *Stream) Raw() *quic.Stream { return s.st }

// translate maps quic-go stream and connection errors to this package's
// error types.
func translate(err error) error {
	if err == nil {
		return nil
	}
	var se *quic.StreamError
	if errors.As(err, &se) {
		return &quicwire.StreamCancelledError{Code: quicwire.StreamCode(se.ErrorCode), Remote: se.Remote}
	}
	if cc, ok := quicwire.CloseReason(err); ok {
		return cc
	}
	return err
}

// ControlStream is the control stream of a connection: one reader, any
// number of writers. Its sends have the highest priority on the connection.
type ControlStream struct {
	s  *Stream
	mu sync.Mutex // serializes writers
}

// NewControlStream wraps the control stream st and raises its priority.
func NewControlStream(st *quic.Stream) *ControlStream {
	st.SetPriority(controlUrgency, false)
	return &ControlStream{s: NewStream(st, "control")}
}

// Send writes one control frame. Writers are serialized. A write blocks only
// while the link itself is stuck (fixed windows keep flow-control credit for
// this stream); the heartbeat's own timer, not the writer, then closes the
// connection, which unblocks the write with an error.
func (c *ControlStream) Send(f *wirepb.ControlFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s.Send(f)
}

// Recv reads the next control frame. Any error ends the control stream;
// a *ProtocolError must close the connection with CloseProtocolError.
func (c *ControlStream) Recv() (*wirepb.ControlFrame, error) {
	f := new(wirepb.ControlFrame)
	if err := c.s.Recv(f); err != nil {
		return nil, err
	}
	return f, nil
}

// Stream is the framed stream under the control stream.
func (c *ControlStream) Stream() *Stream { return c.s }

// HeaderKind names the kind of a dispatched stream from its first frame:
// "run", "tunnel", "command", "embed", or "unknown".
func HeaderKind(hdr *wirepb.StreamHeader) string {
	switch hdr.GetKind().(type) {
	case *wirepb.StreamHeader_Run:
		return "run"
	case *wirepb.StreamHeader_Tunnel:
		return "tunnel"
	case *wirepb.StreamHeader_Command:
		return "command"
	case *wirepb.StreamHeader_Embed:
		return "embed"
	}
	return "unknown"
}
