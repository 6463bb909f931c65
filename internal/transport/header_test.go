package transport_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// streamPair opens a dispatched stream from the Edge's end of a loopback
// connection; accept returns the Node's end once something was sent.
func streamPair(t *testing.T) (edge *transport.Stream, accept func() *transport.Stream) {
	t.Helper()
	ec, nc := connPair(t)
	st, err := ec.OpenStreamSync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	edge = transport.NewStream(st, "run")
	return edge, func() *transport.Stream {
		t.Helper()
		raw, err := nc.AcceptStream(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return transport.NewStream(raw, "header")
	}
}

// runHeader is a run's header whose request is about size bytes.
func runHeader(size int) *wirepb.StreamHeader {
	return &wirepb.StreamHeader{Generation: 7, Kind: &wirepb.StreamHeader_Run{Run: &wirepb.RunRequest{
		RunId: "r1", Target: "m", Messages: []*wirepb.ChatMessage{{Role: "user", Content: strings.Repeat("x", size)}},
	}}}
}

// Issue 21: a run request as large as a session gets travels in as many
// frames as it needs; the frame limit stays a frame limit.
func TestHeaderTravelsInPartsPastOneFrame(t *testing.T) {
	for _, size := range []int{10, quicwire.MaxStreamFrameSize - 100, quicwire.MaxStreamFrameSize + 1, 5<<20 + 12345} {
		edge, accept := streamPair(t)
		hdr := runHeader(size)
		then := &wirepb.RunEvent{Seq: 1}
		sent := make(chan error, 1)
		// The stream's window is far less than the header: the send
		// completes only as the Node reads.
		go func() { sent <- edge.SendHeader(hdr, 8<<20, then) }()
		node := accept()
		parts := 0
		got, err := node.RecvHeader(8<<20, func() { parts++ })
		if err != nil {
			t.Fatalf("size %d: RecvHeader: %v", size, err)
		}
		if !proto.Equal(got, hdr) {
			t.Fatalf("size %d: the reassembled header differs from the one sent", size)
		}
		if wantParts := (proto.Size(hdr) + quicwire.MaxStreamFrameSize - 17) / (quicwire.MaxStreamFrameSize - 16); proto.Size(hdr) > quicwire.MaxStreamFrameSize && parts != wantParts {
			t.Errorf("size %d: %d parts, want %d", size, parts, wantParts)
		} else if proto.Size(hdr) <= quicwire.MaxStreamFrameSize && parts != 0 {
			t.Errorf("size %d: a header that fits one frame came in %d parts", size, parts)
		}
		next := new(wirepb.RunEvent)
		if err := node.Recv(next); err != nil || next.GetSeq() != 1 {
			t.Fatalf("size %d: the frame after the header: %v, %v", size, next, err)
		}
		if err := <-sent; err != nil {
			t.Fatalf("size %d: SendHeader: %v", size, err)
		}
	}
}

// A header past what the Node takes is refused by the sender before
// anything is written, and by a receiver that is announced one.
func TestHeaderPastTheLimitIsRefused(t *testing.T) {
	edge, _ := streamPair(t)
	if err := edge.SendHeader(runHeader(3<<20), 2<<20); !errors.Is(err, transport.ErrHeaderTooLarge) {
		t.Fatalf("SendHeader of 3 MiB to a 2 MiB node: %v, want ErrHeaderTooLarge", err)
	}
	// A peer that takes no parts (an older Node) takes one frame.
	if err := edge.SendHeader(runHeader(quicwire.MaxStreamFrameSize), transport.OneFrameHeader); !errors.Is(err, transport.ErrHeaderTooLarge) {
		t.Fatalf("SendHeader past one frame to a node without parts: %v, want ErrHeaderTooLarge", err)
	}

	edge, accept := streamPair(t)
	go func() { _ = edge.SendHeader(runHeader(3<<20), 8<<20) }() // it fails when the Node cancels the stream
	_, err := accept().RecvHeader(2<<20, nil)
	var pe *transport.ProtocolError
	if !errors.As(err, &pe) || !errors.Is(err, transport.ErrHeaderTooLarge) {
		t.Fatalf("RecvHeader of 3 MiB within 2 MiB: %v, want a protocol error of ErrHeaderTooLarge", err)
	}
}

// A peer that breaks the parts' rules ends the stream with a named
// protocol error, never a header built from what it sent.
func TestHeaderPartsThatBreakTheRules(t *testing.T) {
	whole, err := proto.Marshal(runHeader(100))
	if err != nil {
		t.Fatal(err)
	}
	nested, err := proto.Marshal(&wirepb.StreamHeader{Generation: 7, PartsSize: 5})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		frames []proto.Message
		want   error
	}{
		{"parts past the size announced", []proto.Message{
			&wirepb.StreamHeader{Generation: 7, PartsSize: 10}, &wirepb.HeaderPart{Data: make([]byte, 20)},
		}, transport.ErrUnexpectedFrame},
		{"the stream ends inside the header", []proto.Message{
			&wirepb.StreamHeader{Generation: 7, PartsSize: uint64(len(whole))}, &wirepb.HeaderPart{Data: whole[:50]},
		}, transport.ErrFrameTruncated},
		{"parts that are not a header", []proto.Message{
			&wirepb.StreamHeader{Generation: 7, PartsSize: 3}, &wirepb.HeaderPart{Data: []byte{0xff, 0xff, 0xff}},
		}, transport.ErrFrameGarbled},
		{"a reassembled header announcing parts again", []proto.Message{
			&wirepb.StreamHeader{Generation: 7, PartsSize: uint64(len(nested))}, &wirepb.HeaderPart{Data: nested},
		}, transport.ErrUnexpectedFrame},
		{"a reassembled header of another generation", []proto.Message{
			&wirepb.StreamHeader{Generation: 8, PartsSize: uint64(len(whole))}, &wirepb.HeaderPart{Data: whole},
		}, transport.ErrUnexpectedFrame},
	} {
		t.Run(c.name, func(t *testing.T) {
			edge, accept := streamPair(t)
			if err := edge.SendFrames(c.frames...); err != nil {
				t.Fatal(err)
			}
			_ = edge.CloseSend()
			hdr, err := accept().RecvHeader(1<<20, nil)
			var pe *transport.ProtocolError
			if !errors.As(err, &pe) || !errors.Is(err, c.want) {
				t.Fatalf("RecvHeader = %v, %v; want a protocol error of %v", hdr, err, c.want)
			}
		})
	}
	// A stream that ends before any header is io.EOF, as with Recv.
	edge, accept := streamPair(t)
	if err := edge.SendFrames(); err != nil {
		t.Fatal(err)
	}
	_ = edge.CloseSend()
	if _, err := accept().RecvHeader(1<<20, nil); !errors.Is(err, io.EOF) {
		t.Fatalf("RecvHeader of an empty stream: %v, want io.EOF", err)
	}
}

// FuzzReadHeader feeds arbitrary bytes from an Edge to a Node's reading of
// a dispatched stream's header, whole or in parts. Whatever the bytes, it
// returns a header that announces no parts, or an error: a bad header in
// parts is a *ProtocolError, never a panic, a hang or more than the limit
// held.
func FuzzReadHeader(f *testing.F) {
	whole := runHeader(200)
	b, err := proto.Marshal(whole)
	if err != nil {
		f.Fatal(err)
	}
	lead := &wirepb.StreamHeader{Generation: 7, PartsSize: uint64(len(b))}
	f.Add(encodeFrames(f, quicwire.MaxStreamFrameSize, whole))
	f.Add(encodeFrames(f, quicwire.MaxStreamFrameSize, lead, &wirepb.HeaderPart{Data: b[:100]}, &wirepb.HeaderPart{Data: b[100:]}))
	f.Add(encodeFrames(f, quicwire.MaxStreamFrameSize, lead, &wirepb.HeaderPart{Data: b[:100]}))
	f.Add(encodeFrames(f, quicwire.MaxStreamFrameSize, &wirepb.StreamHeader{Generation: 7, PartsSize: 1 << 30}))
	f.Add(encodeFrames(f, quicwire.MaxStreamFrameSize, &wirepb.StreamHeader{Generation: 7, PartsSize: 3}, &wirepb.HeaderPart{Data: []byte{0xff, 0xff, 0xff}}))
	const limit = 64 << 10
	f.Fuzz(func(t *testing.T, data []byte) {
		r := transport.NewFrameReader(bytes.NewReader(data), quicwire.MaxStreamFrameSize, "run")
		hdr, err := transport.ReadHeader(r.Read, limit, nil)
		if err != nil {
			if hdr != nil {
				t.Fatalf("a header (%v) with an error (%v)", hdr, err)
			}
			return
		}
		if hdr.GetPartsSize() != 0 {
			t.Fatalf("a header that announces parts: %v", hdr)
		}
	})
}
