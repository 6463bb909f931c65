package transport

import (
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// ErrHeaderTooLarge: a stream header (a run or embedding request) is
// larger than the receiving Node takes (RegisterRequest.max_request_bytes).
// The sender refuses to send it; a receiver that is announced one is
// facing a protocol error.
var ErrHeaderTooLarge = errors.New("stream header exceeds the node's request limit")

// partSize is how many bytes of a header one HeaderPart carries: the
// frame limit less the part's own field tag and length.
const partSize = quicwire.MaxStreamFrameSize - 16

// OneFrameHeader is the largest header that travels in one frame: what a
// Node takes that registered no max_request_bytes (an older noded).
const OneFrameHeader = quicwire.MaxStreamFrameSize

// SendHeader writes hdr as the stream's first frame and then after it, all
// in one write when they fit one frame each. A header past one frame
// travels in parts (StreamHeader.parts_size, then HeaderPart frames), when
// the peer takes a header that large: limit is the largest it registered
// (OneFrameHeader for a peer that takes no parts). A header past limit is
// refused before anything is written (errors.Is ErrHeaderTooLarge).
func (s *Stream) SendHeader(hdr *wirepb.StreamHeader, limit int, then ...proto.Message) error {
	size := proto.Size(hdr)
	if size <= quicwire.MaxStreamFrameSize {
		return s.SendFrames(append([]proto.Message{hdr}, then...)...)
	}
	if size > limit {
		return fmt.Errorf("%w: %d bytes, the node takes at most %d", ErrHeaderTooLarge, size, limit)
	}
	whole, err := proto.Marshal(hdr)
	if err != nil {
		return fmt.Errorf("quicwire: marshal stream header: %w", err)
	}
	if err := s.Send(&wirepb.StreamHeader{Generation: hdr.GetGeneration(), PartsSize: uint64(len(whole))}); err != nil {
		return err
	}
	part := new(wirepb.HeaderPart)
	for len(whole) > partSize {
		part.Data, whole = whole[:partSize], whole[partSize:]
		if err := s.Send(part); err != nil {
			return err
		}
	}
	part.Data = whole
	return s.SendFrames(append([]proto.Message{part}, then...)...)
}

// RecvHeader reads the stream's header, reassembling one that came in
// parts (SendHeader) of at most limit bytes; more is a protocol error
// (ErrHeaderTooLarge), as is a part past the announced size or a
// reassembled header that announces parts again. progress, if not nil, is
// called as each part arrives: a large header takes a while on a slow
// link, and its reader's deadline should follow its progress, not its
// size.
func (s *Stream) RecvHeader(limit int, progress func()) (*wirepb.StreamHeader, error) {
	hdr, err := ReadHeader(s.Recv, limit, progress)
	var pe *ProtocolError
	if errors.As(err, &pe) && pe.Stream == "" {
		// Found above the frame layer: the stream ends as Recv ends it
		// for a bad frame.
		s.Cancel(quicwire.StreamProtocolError)
		pe.Stream = s.kind
	}
	return hdr, err
}

// ReadHeader reads a stream header with recv, a stream's frame reader
// (Stream.Recv, FrameReader.Read), reassembling one that comes in parts
// as RecvHeader says. A violation of the parts' rules is a *ProtocolError
// whose Stream is "" (the caller names the stream); recv's own errors are
// returned as they are.
func ReadHeader(recv func(proto.Message) error, limit int, progress func()) (*wirepb.StreamHeader, error) {
	violation := func(err error) error { return &ProtocolError{Err: err} }
	hdr := new(wirepb.StreamHeader)
	if err := recv(hdr); err != nil {
		return nil, err
	}
	n := hdr.GetPartsSize()
	if n == 0 {
		return hdr, nil
	}
	if n > uint64(limit) {
		return nil, violation(fmt.Errorf("%w: %d bytes announced, the limit is %d", ErrHeaderTooLarge, n, limit))
	}
	if hdr.GetKind() != nil {
		return nil, violation(fmt.Errorf("%w: a header announcing parts carries a kind", ErrUnexpectedFrame))
	}
	whole := make([]byte, 0, n)
	part := new(wirepb.HeaderPart)
	for uint64(len(whole)) < n {
		if err := recv(part); err != nil {
			if err == io.EOF {
				return nil, violation(fmt.Errorf("%w: the header ended after %d of %d bytes", ErrFrameTruncated, len(whole), n))
			}
			return nil, err
		}
		if uint64(len(whole)+len(part.GetData())) > n {
			return nil, violation(fmt.Errorf("%w: header parts past the %d bytes announced", ErrUnexpectedFrame, n))
		}
		whole = append(whole, part.GetData()...)
		if progress != nil {
			progress()
		}
	}
	gen := hdr.GetGeneration()
	hdr.Reset()
	if err := proto.Unmarshal(whole, hdr); err != nil {
		return nil, violation(fmt.Errorf("%w: the reassembled header: %v", ErrFrameGarbled, err))
	}
	if hdr.GetPartsSize() != 0 || hdr.GetGeneration() != gen {
		return nil, violation(fmt.Errorf("%w: the reassembled header announces parts again or another generation", ErrUnexpectedFrame))
	}
	return hdr, nil
}
