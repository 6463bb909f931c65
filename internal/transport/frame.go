package transport

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/protobuf/proto"
)

// Sentinel causes of a ProtocolError; test with errors.Is.
var (
	// ErrFrameTooLarge: the length prefix announces more than the limit.
	ErrFrameTooLarge = errors.New("frame exceeds the size limit")
	// ErrFrameTruncated: the stream ended inside a length prefix or a message.
	ErrFrameTruncated = errors.New("frame truncated")
	// ErrFrameGarbled: the length prefix is not a valid varint, or the
	// message does not parse.
	ErrFrameGarbled = errors.New("frame does not parse")
	// ErrUnexpectedFrame: a frame that parses but is not allowed here.
	ErrUnexpectedFrame = errors.New("unexpected frame")
)

// ProtocolError is a violation of the wire protocol by the peer. It ends the
// stream it happened on (or the connection, on the control stream).
type ProtocolError struct {
	// Stream says where: "control", "run", "tunnel", "command", "header".
	Stream string
	// Err is one of the sentinel causes, possibly wrapped with detail.
	Err error
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("protocol error on %s stream: %v", e.Stream, e.Err)
}

func (e *ProtocolError) Unwrap() error { return e.Err }

// FrameReader reads length-delimited protobuf frames with a size limit.
// It is not safe for concurrent use.
type FrameReader struct {
	r      *bufio.Reader // the read-ahead: nil until the first byte arrives, and after the end
	src    io.Reader     // what it reads; nil after the end
	first  [1]byte       // the first byte, read before the read-ahead was made
	held   bool          // first is not yet read from the read-ahead
	limit  int
	stream string
}

// NewFrameReader returns a reader of frames of at most limit bytes from r.
// stream names the stream in errors.
func NewFrameReader(r io.Reader, limit int, stream string) *FrameReader {
	return &FrameReader{src: r, limit: limit, stream: stream}
}

// arrive waits for the stream's first byte, and only then makes the
// read-ahead: a stream waiting for its peer's first frame (an answer's
// head through a prefill of minutes) holds no buffer (issue 25).
func (fr *FrameReader) arrive() error {
	for {
		n, err := fr.src.Read(fr.first[:])
		if n > 0 {
			fr.held = true
			fr.r = bufio.NewReaderSize((*frameSource)(fr), readAhead)
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// frameSource is what the read-ahead reads: the first byte, then the
// stream.
type frameSource FrameReader

func (s *frameSource) Read(p []byte) (int, error) {
	if s.held && len(p) > 0 {
		s.held = false
		p[0] = s.first[0]
		return 1, nil
	}
	return s.src.Read(p)
}

// readAhead is the reader's buffer. Every open stream holds one, on both
// ends, so it is sized for the frames that are many (a token's event or
// body line, a heartbeat) rather than for throughput: a larger frame is
// read past the buffer, straight into the frame's own buffer.
const readAhead = 1 << 10

// Read reads the next frame into m. At a clean end of stream (between
// frames) it returns io.EOF. A malformed frame returns a *ProtocolError.
// Errors of the underlying stream (a reset, a closed connection) are
// returned as they are.
func (fr *FrameReader) Read(m proto.Message) error {
	if fr.r == nil {
		if fr.src == nil {
			return io.EOF
		}
		if err := fr.arrive(); err != nil {
			if err == io.EOF {
				fr.src = nil
			}
			return err
		}
	}
	n, err := binary.ReadUvarint(fr.r)
	switch {
	case err == io.EOF:
		// Nothing more comes: the read-ahead goes. A Node's run waiting
		// through a prefill has read its request to this end (issue 25).
		fr.r, fr.src = nil, nil
		return io.EOF
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fr.protoErr(fmt.Errorf("%w: inside the length prefix", ErrFrameTruncated))
	case err != nil && isOverflow(err):
		return fr.protoErr(fmt.Errorf("%w: bad length prefix", ErrFrameGarbled))
	case err != nil:
		return err
	}
	if n > uint64(fr.limit) {
		return fr.protoErr(fmt.Errorf("%w: %d bytes announced, limit %d", ErrFrameTooLarge, n, fr.limit))
	}
	var buf []byte
	if int(n) <= fr.r.Size() {
		// Most frames fit the read-ahead (a token's line, a heartbeat):
		// unmarshalled where they are. Unmarshal copies what it keeps, so
		// nothing refers to the read-ahead afterwards.
		buf, err = fr.r.Peek(int(n))
		defer fr.r.Discard(len(buf))
	} else {
		// Rare (a large request body's chunk, a large stream header): a
		// buffer of its own, not kept for the next frame, so that a
		// waiting stream holds no more than its read-ahead (issue 25).
		buf, err = fr.readBody(int(n))
	}
	if err != nil {
		if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
			return fr.protoErr(fmt.Errorf("%w: %d-byte message cut short", ErrFrameTruncated, n))
		}
		return err
	}
	if err := proto.Unmarshal(buf, m); err != nil {
		return fr.protoErr(fmt.Errorf("%w: %v", ErrFrameGarbled, err))
	}
	return nil
}

// Ready reports whether a whole frame is already buffered, so that the
// next Read returns it without waiting for the stream. A relay asks before
// it flushes: when the next frame is already here, it is written first and
// one flush carries both. False when in doubt (nothing buffered, a frame
// larger than the read-ahead): a lone frame is never held back.
func (fr *FrameReader) Ready() bool { return fr.Next() != nil }

// Next returns the encoded message of the next frame when it is already
// buffered whole (as Ready), without consuming it; nil otherwise. A relay
// looks at what kind of frame comes next (one after which Read waits for
// more is not ready). The bytes are the reader's: valid until the next
// Read, and not to be changed.
func (fr *FrameReader) Next() []byte {
	if fr.r == nil {
		return nil
	}
	b, _ := fr.r.Peek(fr.r.Buffered()) // never reads: only what is buffered
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil
	}
	end := k + int(n)
	return b[k:end:end]
}

// growStep bounds how far the body buffer grows ahead of the bytes that
// actually arrived: a peer that announces a 1 MiB frame on every stream and
// sends nothing more costs a chunk per stream, not the whole announcement.
const growStep = 64 << 10

// readBody reads an n-byte message into a buffer of its own.
func (fr *FrameReader) readBody(n int) ([]byte, error) {
	var buf []byte
	for have := 0; have < n; {
		want := min(n, have+growStep)
		if cap(buf) < want {
			buf = append(buf[:have], make([]byte, want-have)...)
		}
		buf = buf[:want]
		if _, err := io.ReadFull(fr.r, buf[have:want]); err != nil {
			return nil, err
		}
		have = want
	}
	return buf, nil
}

func (fr *FrameReader) protoErr(err error) error {
	return &ProtocolError{Stream: fr.stream, Err: err}
}

// isOverflow reports whether err is binary.ReadUvarint's overflow error
// (a prefix longer than ten bytes), which has no exported sentinel.
func isOverflow(err error) bool {
	return err != nil && err.Error() == "binary: varint overflows a 64-bit integer"
}

// FrameWriter writes length-delimited protobuf frames with a size limit.
// It is not safe for concurrent use; wrap it (see ControlStream) where
// several goroutines write.
type FrameWriter struct {
	w     io.Writer
	limit int
}

// NewFrameWriter returns a writer of frames of at most limit bytes to w.
func NewFrameWriter(w io.Writer, limit int) *FrameWriter {
	return &FrameWriter{w: w, limit: limit}
}

// frameBufs are the buffers frames are marshalled into, each held for the
// length of one Write: a stream that writes once (the Edge's header of a
// dispatched stream) or not yet (a Node's run waiting through a prefill)
// holds none (issue 25).
var frameBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledFrameBuf bounds the buffers kept in frameBufs: a rare large
// frame's is left to the collector.
const maxPooledFrameBuf = 64 << 10

// Write marshals m and writes it as one frame with a single Write call. A
// message over the limit is not written and returns an error wrapping
// ErrFrameTooLarge: the sender must split it (body chunks) or refuse it.
func (fw *FrameWriter) Write(m proto.Message) error { return fw.WriteFrames(m) }

// WriteFrames marshals ms and writes them, one frame each, with a single
// Write call, so that frames meant to travel together (a stream's header
// and a small request body) go out in one packet. If any message is over
// the limit, nothing is written. The writer must not keep the bytes it is
// given past its Write (io.Writer's rule; a QUIC stream copies or sends
// them before it returns).
func (fw *FrameWriter) WriteFrames(ms ...proto.Message) error {
	bp := frameBufs.Get().(*[]byte)
	buf, err := fw.marshal((*bp)[:0], ms)
	if err == nil {
		_, err = fw.w.Write(buf)
	}
	if cap(buf) <= maxPooledFrameBuf {
		*bp = buf[:0]
		frameBufs.Put(bp)
	}
	return err
}

// marshal appends ms to buf, each with its length prefix.
func (fw *FrameWriter) marshal(buf []byte, ms []proto.Message) ([]byte, error) {
	for _, m := range ms {
		size := proto.Size(m)
		if size > fw.limit {
			return buf, fmt.Errorf("quicwire: outgoing %T of %d bytes: %w (limit %d)", m, size, ErrFrameTooLarge, fw.limit)
		}
		buf = binary.AppendUvarint(buf, uint64(size))
		var err error
		if buf, err = (proto.MarshalOptions{}).MarshalAppend(buf, m); err != nil {
			return buf, fmt.Errorf("quicwire: marshal %T: %w", m, err)
		}
	}
	return buf, nil
}
