package transport_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Frames are a varint length and one protobuf message, with a hard size
// limit per stream kind; a malformed frame is a *ProtocolError that ends the
// stream (the connection, on the control stream), never the process. These
// tests pin that contract down at the byte level; R8 depends on it (the
// control stream must stay small and framed so heartbeats always get
// through).

// frameCase is one message and how it travels.
type frameCase struct {
	name  string
	limit int
	msg   proto.Message
}

func registerRequestFrame() *wirepb.ControlFrame {
	return &wirepb.ControlFrame{Msg: &wirepb.ControlFrame_RegisterRequest{RegisterRequest: &wirepb.RegisterRequest{
		NodeId:          "node-a",
		NodeVersion:     "1.2.3",
		ProtocolVersion: quicwire.ProtocolVersion,
		Providers: []*wirepb.Provider{{
			Name:         "ollama-main",
			Adapter:      "ollama",
			Targets:      []*wirepb.Target{{Name: "llama3:8b"}, {Name: "qwen3:32b"}},
			Capacity:     4,
			State:        wirepb.ProviderState_PROVIDER_STATE_ONLINE,
			Capabilities: []string{"chat", "tools"},
		}},
		LeasePublicKey: bytes.Repeat([]byte{0xAB}, 32),
		Labels:         map[string]string{"zone": "eu-1", "gpu": "a100"},
	}}}
}

func heartbeatFrame(seq uint64) *wirepb.ControlFrame {
	return &wirepb.ControlFrame{Msg: &wirepb.ControlFrame_Heartbeat{Heartbeat: &wirepb.Heartbeat{Seq: seq, SentUnixNano: 946684800000000000 + int64(seq)}}}
}

func runHeaderFrame() *wirepb.StreamHeader {
	return &wirepb.StreamHeader{Generation: 7, Kind: &wirepb.StreamHeader_Run{Run: &wirepb.RunRequest{
		RunId:     "run-1",
		SessionId: "sess-1",
		Provider:  "ollama-main",
		Adapter:   "ollama",
		Target:    "llama3:8b",
		Messages: []*wirepb.ChatMessage{
			{Role: "system", Content: "be brief"},
			{Role: "user", Content: "hello, wörld ✓", Images: [][]byte{{1, 2, 3}}},
			{Role: "assistant", ToolCalls: []*wirepb.ToolCall{{Index: 0, Id: "c1", Name: "lookup", ArgumentsJson: []byte(`{"q":"x"}`)}}},
			{Role: "tool", ToolCallId: "c1", Content: "42"},
		},
		Tools:   []*wirepb.Tool{{Name: "lookup", Description: "look up", ParametersJson: []byte(`{"type":"object"}`)}},
		Options: &wirepb.RunOptions{Temperature: proto.Float64(0.2), MaxTokens: proto.Int64(512), Stop: []string{"\n\n"}, Think: proto.Bool(false)},

		DeadlineUnixMs:         1_700_000_000_000,
		ResponseStallTimeoutMs: 300_000,
		SealedLease:            bytes.Repeat([]byte{0x5A}, 200),
		Binding:                &wirepb.LeaseBinding{Principal: "p", Route: "r", Slot: "s", Profile: "default"},
	}}}
}

func frameCases() []frameCase {
	ctl, str := quicwire.MaxControlFrameSize, quicwire.MaxStreamFrameSize
	return []frameCase{
		{"control/register_request", ctl, registerRequestFrame()},
		{"control/register_response", ctl, &wirepb.ControlFrame{Msg: &wirepb.ControlFrame_RegisterResponse{RegisterResponse: &wirepb.RegisterResponse{
			Accepted: true, Generation: 42, EdgeId: "edge-1", ProtocolVersion: quicwire.ProtocolVersion, LeaseSigningKey: bytes.Repeat([]byte{1}, 32),
		}}}},
		{"control/ready_request", ctl, &wirepb.ControlFrame{Msg: &wirepb.ControlFrame_ReadyRequest{ReadyRequest: &wirepb.NodeReadyRequest{Generation: 42}}}},
		{"control/ready_response", ctl, &wirepb.ControlFrame{Msg: &wirepb.ControlFrame_ReadyResponse{ReadyResponse: &wirepb.NodeReadyResponse{Generation: 42}}}},
		{"control/heartbeat", ctl, heartbeatFrame(1)},
		{"control/heartbeat_ack", ctl, &wirepb.ControlFrame{Msg: &wirepb.ControlFrame_HeartbeatAck{HeartbeatAck: &wirepb.HeartbeatAck{Seq: 1 << 40}}}},
		{"control/provider_status", ctl, &wirepb.ControlFrame{Msg: &wirepb.ControlFrame_ProviderStatus{ProviderStatus: &wirepb.ProviderStatusUpdate{
			Providers: []*wirepb.Provider{{Name: "p", State: wirepb.ProviderState_PROVIDER_STATE_OFFLINE, Detail: "adapter exited"}},
		}}}},
		{"control/drain", ctl, &wirepb.ControlFrame{Msg: &wirepb.ControlFrame_Drain{Drain: &wirepb.DrainNotice{Reason: "upgrade", DeadlineUnixMs: 1}}}},
		{"control/credential_notice", ctl, &wirepb.ControlFrame{Msg: &wirepb.ControlFrame_CredentialNotice{CredentialNotice: &wirepb.CredentialNotice{
			CredentialRevisions: map[string]uint64{"k1": 3, "k2": 9}, DisabledProfiles: []string{"old"},
		}}}},
		// An empty message is a zero-length frame: one prefix byte.
		{"control/empty", ctl, &wirepb.ControlFrame{}},
		{"stream/header_run", str, runHeaderFrame()},
		{"stream/header_tunnel", str, &wirepb.StreamHeader{Generation: 7, Kind: &wirepb.StreamHeader_Tunnel{Tunnel: &wirepb.TunnelRequest{
			TunnelId: "t-1", Method: "POST", Path: "/api/chat?stream=true", Headers: []*wirepb.Header{{Name: "Content-Type", Value: "application/json"}},
		}}}},
		{"stream/run_event_stalled", str, &wirepb.RunEvent{
			Seq: 9, Type: wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED, RunId: "run-1",
			Stall: &wirepb.StallObservation{StallTimeoutMs: 300_000, HealthObservationSeq: 3, NodeId: "node-a", Generation: 7, Retryable: true},
		}},
		{"stream/run_event_text", str, &wirepb.RunEvent{Seq: 1, Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: strings.Repeat("tok ", 1000)}},
		{"stream/tunnel_head", str, &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Head{Head: &wirepb.TunnelResponseHead{Status: 200}}}},
		{"stream/tunnel_body_64KiB", str, &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: patterned(64 << 10)}}},
		{"stream/tunnel_terminal", str, &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Terminal{Terminal: &wirepb.TunnelTerminal{
			Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_UPSTREAM, UpstreamStatus: 502},
		}}}},
		{"stream/command_result", str, &wirepb.CommandResult{CommandId: "c", TransportStatus: &wirepb.TransportStatus{NodeId: "node-a", Generation: 7, HealthObservationSeq: 12}}},
	}
}

// patterned returns n bytes that are not all alike, so a shifted or
// truncated body cannot compare equal by accident.
func patterned(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// encodeFrames writes msgs with a FrameWriter of the given limit.
func encodeFrames(t testing.TB, limit int, msgs ...proto.Message) []byte {
	t.Helper()
	var buf bytes.Buffer
	fw := transport.NewFrameWriter(&buf, limit)
	for _, m := range msgs {
		if err := fw.Write(m); err != nil {
			t.Fatalf("write %T: %v", m, err)
		}
	}
	return buf.Bytes()
}

// newOf returns an empty message of m's type.
func newOf(m proto.Message) proto.Message { return m.ProtoReflect().New().Interface() }

func TestFrameRoundTripsEveryMessageKind(t *testing.T) {
	// Readers that split the input differently: frames must not depend on
	// how the transport chunks a stream.
	chunkings := []struct {
		name string
		wrap func(io.Reader) io.Reader
	}{
		{"whole", func(r io.Reader) io.Reader { return r }},
		{"one_byte", iotest.OneByteReader},
		{"half", iotest.HalfReader},
		{"eof_with_data", iotest.DataErrReader},
	}
	for _, tc := range frameCases() {
		for _, ch := range chunkings {
			t.Run(tc.name+"/"+ch.name, func(t *testing.T) {
				wire := encodeFrames(t, tc.limit, tc.msg)
				fr := transport.NewFrameReader(ch.wrap(bytes.NewReader(wire)), tc.limit, "test")
				got := newOf(tc.msg)
				if err := fr.Read(got); err != nil {
					t.Fatalf("Read: %v", err)
				}
				if !proto.Equal(got, tc.msg) {
					t.Fatalf("round trip changed the message:\n got %v\nwant %v", got, tc.msg)
				}
				if err := fr.Read(newOf(tc.msg)); err != io.EOF {
					t.Fatalf("after the only frame: got %v, want io.EOF", err)
				}
			})
		}
	}
}

// The doc promises the protodelim encoding; a peer using protodelim (or any
// other length-delimited protobuf stream) must interoperate.
func TestFrameEncodingIsProtodelim(t *testing.T) {
	for _, tc := range frameCases() {
		t.Run(tc.name, func(t *testing.T) {
			wire := encodeFrames(t, tc.limit, tc.msg)
			got := newOf(tc.msg)
			if err := (protodelim.UnmarshalOptions{MaxSize: -1}).UnmarshalFrom(bytes.NewReader(wire), got); err != nil {
				t.Fatalf("protodelim cannot read a FrameWriter frame: %v", err)
			}
			if !proto.Equal(got, tc.msg) {
				t.Fatalf("protodelim read %v, want %v", got, tc.msg)
			}

			var pd bytes.Buffer
			if _, err := protodelim.MarshalTo(&pd, tc.msg); err != nil {
				t.Fatal(err)
			}
			got = newOf(tc.msg)
			if err := transport.NewFrameReader(&pd, tc.limit, "test").Read(got); err != nil {
				t.Fatalf("FrameReader cannot read a protodelim frame: %v", err)
			}
			if !proto.Equal(got, tc.msg) {
				t.Fatalf("FrameReader read %v, want %v", got, tc.msg)
			}
		})
	}
}

func TestManyFramesBackToBackThenCleanEOF(t *testing.T) {
	const n = 1000
	var msgs []proto.Message
	for i := range n {
		switch i % 4 {
		case 0:
			msgs = append(msgs, &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: patterned(1 + i*37%(64<<10))}})
		case 1:
			msgs = append(msgs, &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: bytes.Repeat([]byte{byte(i)}, i)}})
		case 2:
			msgs = append(msgs, &wirepb.TunnelFrame{}) // empty: zero-length frame
		case 3:
			msgs = append(msgs, &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Head{Head: &wirepb.TunnelResponseHead{Status: int32(i)}}})
		}
	}
	wire := encodeFrames(t, quicwire.MaxStreamFrameSize, msgs...)

	for _, oneByte := range []bool{false, true} {
		t.Run(fmt.Sprintf("one_byte=%v", oneByte), func(t *testing.T) {
			var r io.Reader = bytes.NewReader(wire)
			if oneByte {
				r = iotest.OneByteReader(r)
			}
			fr := transport.NewFrameReader(r, quicwire.MaxStreamFrameSize, "tunnel")
			var got []*wirepb.TunnelFrame
			for {
				m := new(wirepb.TunnelFrame)
				err := fr.Read(m)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("frame %d: %v", len(got), err)
				}
				got = append(got, m)
			}
			if len(got) != n {
				t.Fatalf("read %d frames, wrote %d", len(got), n)
			}
			// Compared only now: a decoded message must not alias the
			// reader's buffer, which later frames overwrite.
			for i := range got {
				if !proto.Equal(got[i], msgs[i]) {
					t.Fatalf("frame %d changed after later reads: got %v, want %v", i, got[i], msgs[i])
				}
			}
			// EOF is sticky: the stream is over, not broken.
			if err := fr.Read(new(wirepb.TunnelFrame)); err != io.EOF {
				t.Fatalf("second read at end: got %v, want io.EOF", err)
			}
		})
	}
}

func TestEmptyStreamIsCleanEOF(t *testing.T) {
	err := transport.NewFrameReader(bytes.NewReader(nil), quicwire.MaxControlFrameSize, "control").Read(new(wirepb.ControlFrame))
	if err != io.EOF {
		t.Fatalf("got %v, want exactly io.EOF", err)
	}
}

// prefixOnlyReader hands out the length prefix and then reports any
// further read: a FrameReader that rejects an oversized prefix must not
// touch the announced body.
type prefixOnlyReader struct {
	prefix []byte
	past   int // reads after the prefix was consumed
}

var errReadPastPrefix = errors.New("read past the length prefix")

func (r *prefixOnlyReader) Read(p []byte) (int, error) {
	if len(r.prefix) == 0 {
		r.past++
		return 0, errReadPastPrefix
	}
	n := copy(p, r.prefix)
	r.prefix = r.prefix[n:]
	return n, nil
}

func TestOversizedPrefixIsRejectedBeforeTheBodyIsRead(t *testing.T) {
	cases := []struct {
		name      string
		limit     int
		announced uint64
	}{
		{"control_limit_plus_one", quicwire.MaxControlFrameSize, quicwire.MaxControlFrameSize + 1},
		{"stream_limit_plus_one", quicwire.MaxStreamFrameSize, quicwire.MaxStreamFrameSize + 1},
		{"control_announces_stream_limit", quicwire.MaxControlFrameSize, quicwire.MaxStreamFrameSize},
		{"max_uint64", quicwire.MaxStreamFrameSize, ^uint64(0)},
		{"max_int64_plus_one", quicwire.MaxStreamFrameSize, 1 << 63},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := &prefixOnlyReader{prefix: binary.AppendUvarint(nil, tc.announced)}
			err := transport.NewFrameReader(src, tc.limit, "control").Read(new(wirepb.ControlFrame))
			assertProtocolError(t, err, transport.ErrFrameTooLarge, "control")
			if src.past != 0 {
				t.Fatalf("the reader read %d times past the prefix of an oversized frame", src.past)
			}
		})
	}
}

func TestFrameOfExactlyTheLimitIsAccepted(t *testing.T) {
	for _, limit := range []int{quicwire.MaxControlFrameSize, quicwire.MaxStreamFrameSize} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			m := bodyOfWireSize(t, limit)
			wire := encodeFrames(t, limit, m)
			got := new(wirepb.TunnelFrame)
			if err := transport.NewFrameReader(bytes.NewReader(wire), limit, "tunnel").Read(got); err != nil {
				t.Fatalf("a frame of exactly the limit was refused: %v", err)
			}
			if !proto.Equal(got, m) {
				t.Fatal("frame of exactly the limit changed in transit")
			}
			// One byte more is refused on both ends.
			big := bodyOfWireSize(t, limit+1)
			if err := transport.NewFrameWriter(io.Discard, limit).Write(big); !errors.Is(err, transport.ErrFrameTooLarge) {
				t.Fatalf("writer: got %v, want ErrFrameTooLarge", err)
			}
			wire = encodeFrames(t, limit+1, big)
			err := transport.NewFrameReader(bytes.NewReader(wire), limit, "tunnel").Read(new(wirepb.TunnelFrame))
			assertProtocolError(t, err, transport.ErrFrameTooLarge, "tunnel")
		})
	}
}

// bodyOfWireSize returns a TunnelFrame whose encoding is exactly size bytes.
func bodyOfWireSize(t *testing.T, size int) *wirepb.TunnelFrame {
	t.Helper()
	for n := size - 1; n >= 0; n-- { // tag + varint(len) + len
		m := &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: patterned(n)}}
		if s := proto.Size(m); s == size {
			return m
		} else if s < size {
			break
		}
	}
	t.Fatalf("no body encodes to exactly %d bytes", size)
	return nil
}

func TestMalformedFramesAreProtocolErrors(t *testing.T) {
	valid := encodeFrames(t, quicwire.MaxControlFrameSize, registerRequestFrame())
	cases := []struct {
		name string
		wire []byte
		want error
	}{
		{"truncated_in_prefix_one_byte", []byte{0x80}, transport.ErrFrameTruncated},
		{"truncated_in_prefix_two_bytes", []byte{0xff, 0xff}, transport.ErrFrameTruncated},
		{"truncated_in_prefix_after_a_frame", append(bytes.Clone(valid), 0x81), transport.ErrFrameTruncated},
		{"truncated_before_message", []byte{10}, transport.ErrFrameTruncated},
		{"truncated_inside_message", []byte{10, 0x2a, 0x02, 0x08}, transport.ErrFrameTruncated},
		{"valid_frame_missing_last_byte", valid[:len(valid)-1], transport.ErrFrameTruncated},
		{"varint_eleven_bytes", append(bytes.Repeat([]byte{0x80}, 10), 0x01), transport.ErrFrameGarbled},
		{"varint_ten_continuation_bytes", bytes.Repeat([]byte{0xff}, 10), transport.ErrFrameGarbled},
		{"varint_tenth_byte_overflows", append(bytes.Repeat([]byte{0xff}, 9), 0x02), transport.ErrFrameGarbled},
		{"invalid_wire_type", []byte{1, 0x0f}, transport.ErrFrameGarbled},
		{"field_number_zero", []byte{2, 0x00, 0x00}, transport.ErrFrameGarbled},
		{"submessage_longer_than_frame", []byte{3, 0x0a, 0x05, 0x00}, transport.ErrFrameGarbled},
		// RegisterRequest.node_id = "\xff": proto3 strings must be UTF-8.
		{"invalid_utf8_string", []byte{5, 0x0a, 0x03, 0x0a, 0x01, 0xff}, transport.ErrFrameGarbled},
		{"random_bytes", []byte{8, 0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef}, transport.ErrFrameGarbled},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fr := transport.NewFrameReader(bytes.NewReader(tc.wire), quicwire.MaxControlFrameSize, "control")
			var err error
			for range len(tc.wire) + 1 {
				if err = fr.Read(new(wirepb.ControlFrame)); err != nil {
					break
				}
			}
			assertProtocolError(t, err, tc.want, "control")
		})
	}
}

func assertProtocolError(t *testing.T, err, sentinel error, stream string) {
	t.Helper()
	var pe *transport.ProtocolError
	if !errors.As(err, &pe) {
		t.Fatalf("got %v (%T), want a *ProtocolError", err, err)
	}
	if !errors.Is(pe.Err, sentinel) {
		t.Fatalf("ProtocolError.Err = %v, want errors.Is %v", pe.Err, sentinel)
	}
	for _, other := range []error{transport.ErrFrameTooLarge, transport.ErrFrameTruncated, transport.ErrFrameGarbled, transport.ErrUnexpectedFrame} {
		if other != sentinel && errors.Is(err, other) {
			t.Fatalf("%v also matches %v", err, other)
		}
	}
	if pe.Stream != stream {
		t.Fatalf("ProtocolError.Stream = %q, want %q", pe.Stream, stream)
	}
	if !strings.Contains(err.Error(), stream) {
		t.Fatalf("error %q does not name the %s stream", err, stream)
	}
}

// A failing transport (a reset stream, a closed connection) is not the
// peer's protocol violation: its error must reach the caller unchanged so
// Stream can translate it.
func TestTransportErrorsAreReturnedAsTheyAre(t *testing.T) {
	errBoom := errors.New("stream reset by peer")
	valid := encodeFrames(t, quicwire.MaxControlFrameSize, registerRequestFrame())
	cases := []struct {
		name   string
		before []byte
		frames int // complete frames before the failure
	}{
		{"before_anything", nil, 0},
		{"between_frames", valid, 1},
		{"inside_prefix", []byte{0x80}, 0},
		{"inside_message", valid[:len(valid)/2], 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := io.MultiReader(bytes.NewReader(tc.before), iotest.ErrReader(errBoom))
			fr := transport.NewFrameReader(r, quicwire.MaxControlFrameSize, "control")
			for i := range tc.frames {
				if err := fr.Read(new(wirepb.ControlFrame)); err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
			}
			err := fr.Read(new(wirepb.ControlFrame))
			if err != errBoom {
				t.Fatalf("got %v (%T), want the transport's own error", err, err)
			}
		})
	}
}

// frameCountingWriter records every Write call separately.
type frameCountingWriter struct {
	writes [][]byte
	err    error
}

func (w *frameCountingWriter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, bytes.Clone(p))
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

func TestWriterRefusesOversizedMessageAndWritesNothing(t *testing.T) {
	cases := []struct {
		name  string
		limit int
		msg   proto.Message
	}{
		{"control_body_at_limit", quicwire.MaxControlFrameSize, &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: make([]byte, quicwire.MaxControlFrameSize)}}},
		{"stream_body_at_limit", quicwire.MaxStreamFrameSize, &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: make([]byte, quicwire.MaxStreamFrameSize)}}},
		{"control_register_with_huge_labels", quicwire.MaxControlFrameSize, &wirepb.ControlFrame{Msg: &wirepb.ControlFrame_RegisterRequest{RegisterRequest: &wirepb.RegisterRequest{
			Labels: map[string]string{"big": strings.Repeat("x", quicwire.MaxControlFrameSize)},
		}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := &frameCountingWriter{}
			err := transport.NewFrameWriter(w, tc.limit).Write(tc.msg)
			if !errors.Is(err, transport.ErrFrameTooLarge) {
				t.Fatalf("got %v, want ErrFrameTooLarge", err)
			}
			if len(w.writes) != 0 {
				t.Fatalf("an oversized message wrote %d chunks; want nothing on the wire", len(w.writes))
			}
		})
	}
}

// One Write per frame: a QUIC stream write is then one unit, and a writer
// serialized by a lock (ControlStream) never interleaves half-frames.
func TestWriterIssuesExactlyOneWritePerFrame(t *testing.T) {
	w := &frameCountingWriter{}
	fw := transport.NewFrameWriter(w, quicwire.MaxStreamFrameSize)
	var msgs []proto.Message
	for _, tc := range frameCases() {
		msgs = append(msgs, tc.msg)
	}
	// Sizes around the writer's buffer reuse threshold and up to the limit.
	for _, n := range []int{0, 1, 127, 128, 64<<10 - 8, 64 << 10, 64<<10 + 1, 512 << 10, quicwire.MaxStreamFrameSize - 8} {
		msgs = append(msgs, &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: patterned(n)}})
	}
	for i, m := range msgs {
		if err := fw.Write(m); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if len(w.writes) != i+1 {
			t.Fatalf("message %d: %d Write calls so far, want %d", i, len(w.writes), i+1)
		}
	}
	// Each Write is one whole frame, and nothing else.
	for i, chunk := range w.writes {
		fr := transport.NewFrameReader(bytes.NewReader(chunk), quicwire.MaxStreamFrameSize, "test")
		got := newOf(msgs[i])
		if err := fr.Read(got); err != nil {
			t.Fatalf("write %d is not a whole frame: %v", i, err)
		}
		if !proto.Equal(got, msgs[i]) {
			t.Fatalf("write %d decodes to %v, want %v", i, got, msgs[i])
		}
		if err := fr.Read(newOf(msgs[i])); err != io.EOF {
			t.Fatalf("write %d holds more than one frame: %v", i, err)
		}
	}
}

// WriteFrames puts a stream's header and a small body in one Write, so
// they leave in one packet; a message over the limit anywhere in the batch
// writes nothing at all.
func TestWriteFramesIsOneWriteOrNothing(t *testing.T) {
	w := &frameCountingWriter{}
	fw := transport.NewFrameWriter(w, quicwire.MaxStreamFrameSize)
	hdr := runHeaderFrame()
	body := &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: patterned(300)}}
	if err := fw.WriteFrames(hdr, body); err != nil {
		t.Fatal(err)
	}
	if len(w.writes) != 1 {
		t.Fatalf("%d Write calls for two frames, want 1", len(w.writes))
	}
	fr := transport.NewFrameReader(bytes.NewReader(w.writes[0]), quicwire.MaxStreamFrameSize, "test")
	for _, want := range []proto.Message{hdr, body} {
		got := newOf(want)
		if err := fr.Read(got); err != nil || !proto.Equal(got, want) {
			t.Fatalf("read %v (%v), want %v", got, err, want)
		}
	}
	if err := fr.Read(newOf(body)); err != io.EOF {
		t.Fatalf("after both frames: %v, want io.EOF", err)
	}

	huge := &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: make([]byte, quicwire.MaxStreamFrameSize)}}
	if err := fw.WriteFrames(hdr, huge); !errors.Is(err, transport.ErrFrameTooLarge) {
		t.Fatalf("got %v, want ErrFrameTooLarge", err)
	}
	if len(w.writes) != 1 {
		t.Fatalf("a batch with an oversized frame wrote %d more chunks; want nothing", len(w.writes)-1)
	}
}

// Ready says a whole frame is buffered only when Read would return it
// without reading from the stream again: never for a frame cut short.
func TestReadyOnlyForAWholeBufferedFrame(t *testing.T) {
	small := &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: patterned(100)}}
	wire := encodeFrames(t, quicwire.MaxStreamFrameSize, small, small)
	cut := len(wire) - 10 // the second frame is missing its last 10 bytes

	pr, pw := io.Pipe()
	fr := transport.NewFrameReader(pr, quicwire.MaxStreamFrameSize, "test")
	if fr.Ready() {
		t.Fatal("Ready before anything arrived")
	}
	go func() { _, _ = pw.Write(wire[:cut]) }() // one read takes both parts
	if err := fr.Read(newOf(small)); err != nil {
		t.Fatal(err)
	}
	if fr.Ready() {
		t.Fatal("Ready with the next frame cut short")
	}
	go func() { _, _ = pw.Write(wire[cut:]); pw.Close() }()
	if err := fr.Read(newOf(small)); err != nil {
		t.Fatal(err)
	}

	// Two whole frames in one read: the second is ready after the first.
	fr = transport.NewFrameReader(bytes.NewReader(wire), quicwire.MaxStreamFrameSize, "test")
	if err := fr.Read(newOf(small)); err != nil {
		t.Fatal(err)
	}
	if !fr.Ready() {
		t.Fatal("not Ready with the next frame whole in the buffer")
	}
	// Next shows the ready frame's message, and consumes nothing.
	if want, _ := proto.Marshal(small); !bytes.Equal(fr.Next(), want) {
		t.Fatalf("Next = %x, want the message %x", fr.Next(), want)
	}
	if err := fr.Read(newOf(small)); err != nil {
		t.Fatal(err)
	}
	if fr.Ready() || fr.Next() != nil {
		t.Fatal("Ready at the end of the stream")
	}
}

func TestWriterReturnsTheTransportError(t *testing.T) {
	errBoom := errors.New("stream reset")
	w := &frameCountingWriter{err: errBoom}
	if err := transport.NewFrameWriter(w, quicwire.MaxControlFrameSize).Write(heartbeatFrame(1)); !errors.Is(err, errBoom) {
		t.Fatalf("got %v, want the writer's error", err)
	}
}

func TestFrameLimits(t *testing.T) {
	if quicwire.MaxControlFrameSize != 64<<10 {
		t.Errorf("MaxControlFrameSize = %d, want 64 KiB", quicwire.MaxControlFrameSize)
	}
	if quicwire.MaxStreamFrameSize != 1<<20 {
		t.Errorf("MaxStreamFrameSize = %d, want 1 MiB", quicwire.MaxStreamFrameSize)
	}
	// "Well below": a body chunk leaves most of a frame for everything else.
	if quicwire.MaxBodyChunkSize <= 0 || quicwire.MaxBodyChunkSize > quicwire.MaxStreamFrameSize/4 {
		t.Errorf("MaxBodyChunkSize = %d, want positive and at most a quarter of quicwire.MaxStreamFrameSize (%d)", quicwire.MaxBodyChunkSize, quicwire.MaxStreamFrameSize)
	}
}

// A full body chunk plus a generous header list (16 KiB) fits one stream
// frame. TunnelFrame is a oneof, so today a frame carries either the head or
// a body; the sum of both encodings bounds any frame that would carry both.
func TestFullBodyChunkAndHeadersFitAStreamFrame(t *testing.T) {
	var headers []*wirepb.Header
	size := 0
	for i := 0; size < 16<<10; i++ {
		h := &wirepb.Header{Name: fmt.Sprintf("X-Header-%03d", i), Value: strings.Repeat("v", 100)}
		headers = append(headers, h)
		size += len(h.Name) + len(h.Value)
	}
	head := &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Head{Head: &wirepb.TunnelResponseHead{Status: 200, Headers: headers}}}
	body := &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: patterned(quicwire.MaxBodyChunkSize)}}
	req := &wirepb.StreamHeader{Generation: 1, Kind: &wirepb.StreamHeader_Tunnel{Tunnel: &wirepb.TunnelRequest{TunnelId: "t", Headers: headers}}}

	total := proto.Size(head) + proto.Size(body) + 2*binary.MaxVarintLen64
	if total > quicwire.MaxStreamFrameSize {
		t.Fatalf("body chunk + 16 KiB of headers = %d bytes, over quicwire.MaxStreamFrameSize %d", total, quicwire.MaxStreamFrameSize)
	}
	wire := encodeFrames(t, quicwire.MaxStreamFrameSize, req, head, body)
	fr := transport.NewFrameReader(bytes.NewReader(wire), quicwire.MaxStreamFrameSize, "tunnel")
	for _, want := range []proto.Message{req, head, body} {
		got := newOf(want)
		if err := fr.Read(got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

// Issue 25: writers marshal into buffers they share between Writes (a
// stream that writes once holds none), so writers on many streams at once
// must each still write exactly their own frames.
func TestConcurrentWritersEachWriteTheirOwnFrames(t *testing.T) {
	const writers, frames = 8, 200
	var bufs [writers]bytes.Buffer
	done := make(chan struct{})
	for w := range writers {
		go func() {
			defer func() { done <- struct{}{} }()
			fw := transport.NewFrameWriter(&bufs[w], quicwire.MaxStreamFrameSize)
			for i := range frames {
				body := bytes.Repeat([]byte{byte(w)}, 1+(i*131)%(70<<10)) // some past the pooled size
				if err := fw.Write(&wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: body}}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for range writers {
		<-done
	}
	for w := range writers {
		fr := transport.NewFrameReader(&bufs[w], quicwire.MaxStreamFrameSize, "tunnel")
		for i := range frames {
			m := new(wirepb.TunnelFrame)
			if err := fr.Read(m); err != nil {
				t.Fatalf("writer %d frame %d: %v", w, i, err)
			}
			if want := bytes.Repeat([]byte{byte(w)}, 1+(i*131)%(70<<10)); !bytes.Equal(m.GetBody(), want) {
				t.Fatalf("writer %d frame %d: %d bytes not all %d", w, i, len(m.GetBody()), w)
			}
		}
		if err := fr.Read(new(wirepb.TunnelFrame)); err != io.EOF || fr.Next() != nil {
			t.Fatalf("writer %d: after its frames %v, want io.EOF and nothing next", w, err)
		}
	}
}

// sizesReader records the size of each read asked of it.
type sizesReader struct {
	r     io.Reader
	sizes []int
}

func (s *sizesReader) Read(p []byte) (int, error) {
	s.sizes = append(s.sizes, len(p))
	return s.r.Read(p)
}

// Issue 25 (P3): a stream waits for its peer's first frame (an answer's
// head through a prefill of minutes) with no read-ahead: its first read
// asks for one byte, and the buffer is made once that byte is here. The
// frames read afterwards are whole and in order.
func TestAWaitingStreamHoldsNoReadAhead(t *testing.T) {
	var wire bytes.Buffer
	w := transport.NewFrameWriter(&wire, quicwire.MaxStreamFrameSize)
	want := []string{"first", strings.Repeat("b", 300), "third"}
	for _, b := range want {
		if err := w.Write(&wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: []byte(b)}}); err != nil {
			t.Fatal(err)
		}
	}
	src := &sizesReader{r: &wire}
	fr := transport.NewFrameReader(src, quicwire.MaxStreamFrameSize, "tunnel")
	for _, b := range want {
		var f wirepb.TunnelFrame
		if err := fr.Read(&f); err != nil || string(f.GetBody()) != b {
			t.Fatalf("frame %q: got %q, %v", b, f.GetBody(), err)
		}
	}
	if err := fr.Read(new(wirepb.TunnelFrame)); err != io.EOF {
		t.Fatalf("at the end: %v, want io.EOF", err)
	}
	if len(src.sizes) < 2 || src.sizes[0] != 1 || src.sizes[1] <= 1 {
		t.Errorf("the reads asked of the stream were %v: want one byte first, then the read-ahead", src.sizes)
	}
}
