package transport_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// FuzzFrameReader feeds arbitrary bytes from a peer to a FrameReader. A
// malformed frame ends the stream with a *ProtocolError, never the process
// (see the package doc); whatever does decode survives a second trip.
//
// stream selects the reader: false is the control stream (ControlFrame,
// MaxControlFrameSize), true a dispatched stream's first frame
// (StreamHeader, MaxStreamFrameSize).
//
// Committed seeds live in testdata/fuzz/FuzzFrameReader.
func FuzzFrameReader(f *testing.F) {
	for _, m := range []proto.Message{
		registerRequestFrame(),
		heartbeatFrame(1),
		&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_HeartbeatAck{HeartbeatAck: &wirepb.HeartbeatAck{Seq: 1}}},
		&wirepb.ControlFrame{},
	} {
		f.Add(false, encodeFrames(f, quicwire.MaxControlFrameSize, m))
	}
	f.Add(false, encodeFrames(f, quicwire.MaxControlFrameSize, registerRequestFrame(), heartbeatFrame(1), heartbeatFrame(2)))
	f.Add(true, encodeFrames(f, quicwire.MaxStreamFrameSize, runHeaderFrame()))
	f.Add(true, encodeFrames(f, quicwire.MaxStreamFrameSize, &wirepb.StreamHeader{Generation: 3, Kind: &wirepb.StreamHeader_Command{Command: &wirepb.CommandRequest{CommandId: "c", Kind: wirepb.CommandKind_COMMAND_KIND_TRANSPORT_STATUS}}}))
	// Announces MaxControlFrameSize+1.
	f.Add(false, []byte{0x81, 0x80, 0x04})
	// Cut inside the prefix.
	f.Add(false, []byte{0x80})
	// Prefix longer than a varint.
	f.Add(false, bytes.Repeat([]byte{0xff}, 11))
	// run_id is not UTF-8.
	f.Add(true, []byte{5, 0x12, 0x03, 0x0a, 0x01, 0xff})
	// Announces MaxStreamFrameSize, has 16 bytes.
	f.Add(true, append([]byte{0x80, 0x80, 0x40}, make([]byte, 16)...))
	// A frame, then a cut one.
	f.Add(false, append(encodeFrames(f, quicwire.MaxControlFrameSize, heartbeatFrame(9)), 0x0a))

	f.Fuzz(func(t *testing.T, stream bool, data []byte) {
		limit, newMsg := quicwire.MaxControlFrameSize, func() proto.Message { return new(wirepb.ControlFrame) }
		if stream {
			limit, newMsg = quicwire.MaxStreamFrameSize, func() proto.Message { return new(wirepb.StreamHeader) }
		}
		fr := transport.NewFrameReader(bytes.NewReader(data), limit, "fuzz")
		frames := 0
		for {
			m := newMsg()
			err := fr.Read(m)
			if err == io.EOF {
				break
			}
			if err != nil {
				// The source is a bytes.Reader: it only ever ends, so every
				// failure is the data's fault.
				var pe *transport.ProtocolError
				if !errors.As(err, &pe) {
					t.Fatalf("error %v (%T) is neither io.EOF nor a *ProtocolError", err, err)
				}
				if !errors.Is(err, transport.ErrFrameTooLarge) && !errors.Is(err, transport.ErrFrameTruncated) && !errors.Is(err, transport.ErrFrameGarbled) {
					t.Fatalf("ProtocolError %v has no sentinel cause", err)
				}
				break
			}
			frames++
			// Every frame takes at least its one-byte prefix.
			if frames > len(data) {
				t.Fatalf("decoded %d frames from %d bytes", frames, len(data))
			}
			reencode(t, m, limit, newMsg)
		}
	})
}

// reencode checks that a decoded message survives FrameWriter and
// FrameReader again unchanged. The limit may have to grow: re-encoding is
// canonical and can be longer than what the peer sent (a map entry without
// a value gains an explicit empty one; a negative int32 sent as a 5-byte
// varint becomes 10 bytes), so a frame just under the limit may come back
// just over it.
func reencode(t *testing.T, m proto.Message, limit int, newMsg func() proto.Message) {
	t.Helper()
	limit = max(limit, proto.Size(m))
	var buf bytes.Buffer
	if err := transport.NewFrameWriter(&buf, limit).Write(m); err != nil {
		t.Fatalf("re-encoding a decoded %T: %v", m, err)
	}
	again := newMsg()
	fr := transport.NewFrameReader(&buf, limit, "fuzz")
	if err := fr.Read(again); err != nil {
		t.Fatalf("decoding a re-encoded %T: %v", m, err)
	}
	if !proto.Equal(m, again) {
		t.Fatalf("round trip changed the message:\n first %v\nsecond %v", m, again)
	}
	if err := fr.Read(newMsg()); err != io.EOF {
		t.Fatalf("re-encoding wrote more than one frame: %v", err)
	}
}

// The committed seeds are named after what they hold; check that they do,
// so a seed meant to be valid is not silently garbled (or the reverse).
func TestFuzzSeedCorpusIsWhatItsNamesSay(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzFrameReader", "*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) < 5 {
		t.Fatalf("%d committed seeds, want at least 5", len(paths))
	}
	want := map[string]error{
		"valid_":     io.EOF,
		"oversized_": transport.ErrFrameTooLarge,
		"truncated_": transport.ErrFrameTruncated,
		"garbled_":   transport.ErrFrameGarbled,
	}
	for _, p := range paths {
		name := filepath.Base(p)
		t.Run(name, func(t *testing.T) {
			stream, data := readSeed(t, p)
			var expect error
			for prefix, e := range want {
				if strings.HasPrefix(name, prefix) {
					expect = e
				}
			}
			if expect == nil {
				t.Fatalf("seed name %q does not say what it holds (valid_, oversized_, truncated_, garbled_)", name)
			}
			limit, msg := quicwire.MaxControlFrameSize, proto.Message(new(wirepb.ControlFrame))
			if stream {
				limit, msg = quicwire.MaxStreamFrameSize, new(wirepb.StreamHeader)
			}
			fr := transport.NewFrameReader(bytes.NewReader(data), limit, "seed")
			frames := 0
			for ; ; frames++ {
				if err = fr.Read(msg); err != nil {
					break
				}
			}
			if !errors.Is(err, expect) {
				t.Fatalf("after %d frames: %v, want %v", frames, err, expect)
			}
			if expect == io.EOF && frames == 0 {
				t.Fatal("a valid seed holds no frame")
			}
		})
	}
}

// readSeed parses a "go test fuzz v1" file of FuzzFrameReader.
func readSeed(t *testing.T, path string) (bool, []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 3 || lines[0] != "go test fuzz v1" {
		t.Fatalf("%s: not a go test fuzz v1 file with two values", path)
	}
	stream, err := strconv.ParseBool(strings.TrimSuffix(strings.TrimPrefix(lines[1], "bool("), ")"))
	if err != nil {
		t.Fatalf("%s: first value: %v", path, err)
	}
	data, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[2], "[]byte("), ")"))
	if err != nil {
		t.Fatalf("%s: second value: %v", path, err)
	}
	return stream, []byte(data)
}
