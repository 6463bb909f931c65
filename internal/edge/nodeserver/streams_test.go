package nodeserver_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// forEachNetwork runs f over quic-go's simnet in a synctest bubble (real
// profile, fake time) and over real UDP on 127.0.0.1 (scaled profile).
func forEachNetwork(t *testing.T, f func(t *testing.T, h *harness), opts ...harnessOpt) {
	t.Run("simnet", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) { f(t, newSimHarness(t, opts...)) })
	})
	t.Run("udp", func(t *testing.T) { f(t, newUDPHarness(t, opts...)) })
}

// ticker is a run handler that sends a text event every 100 ms until its
// stream or connection ends, and reports how it ended.
func ticker(ended chan<- error) handlerFunc {
	return func(ctx context.Context, sess *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream) {
		for seq := uint64(1); ; seq++ {
			if err := st.Send(textEvent(seq, hdr.GetRun().GetRunId())); err != nil {
				ended <- err
				return
			}
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				ended <- ctx.Err()
				return
			}
		}
	}
}

// R10: cancelling one stream ends that stream only; another on the same
// connection keeps flowing.
func TestCancellingOneStreamLeavesAnotherFlowing(t *testing.T) {
	forEachNetwork(t, func(t *testing.T, h *harness) {
		e := h.startEdge(0)
		ended := make(chan error, 2)
		h.startNode("n1", withHandler(ticker(ended)))
		h.waitReady("n1")
		a, err := e.srv.Dispatch(t.Context(), "n1", runHeader("a"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := e.srv.Dispatch(t.Context(), "n1", runHeader("b"))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Cancel(quicwire.StreamCancelled)
		ev := new(wirepb.RunEvent)
		for _, s := range []*transport.Stream{a.Stream, b.Stream} {
			if err := s.Recv(ev); err != nil {
				t.Fatal(err)
			}
		}

		a.Cancel(quicwire.StreamCancelled)
		var sc *quicwire.StreamCancelledError
		select {
		case err := <-ended:
			if !errors.As(err, &sc) || sc.Code != quicwire.StreamCancelled || !sc.Remote {
				t.Fatalf("node handler of the cancelled stream ended with %v, want cancelled by the edge", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("node handler of the cancelled stream did not end")
		}
		last := uint64(0)
		for range 10 {
			if err := b.Recv(ev); err != nil {
				t.Fatalf("the other stream broke after the cancel: %v", err)
			}
			if ev.GetText() != "b" || ev.GetSeq() <= last {
				t.Fatalf("the other stream delivered %v after seq %d", ev, last)
			}
			last = ev.GetSeq()
		}
		if _, err := e.reg.Dispatchable("n1"); err != nil {
			t.Fatalf("node not dispatchable after a stream cancel: %v", err)
		}
	})
}

// Decision 3: an oversized, truncated or garbled frame on a dispatched
// stream is a named protocol error that ends that stream only.
func TestMalformedFramesOnADispatchedStreamEndThatStreamOnly(t *testing.T) {
	varint := func(n uint64) []byte { return binary.AppendUvarint(nil, n) }
	cases := []struct {
		name  string
		bytes []byte
	}{
		{"oversized", append(varint(quicwire.MaxStreamFrameSize+1), make([]byte, 1024)...)},
		{"truncated", append(varint(100), make([]byte, 10)...)},
		{"garbled", append(varint(8), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)},
		{"bad varint", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
	}
	forEachNetwork(t, func(t *testing.T, h *harness) {
		e := h.startEdge(0)
		ended := make(chan error, 10)
		writeRaw := make(chan []byte, 1)
		runs := ticker(ended)
		h.startNode("n1", withHandler(handlerFunc(func(ctx context.Context, sess *transport.Session, hdr *wirepb.StreamHeader, st *transport.Stream) {
			if hdr.GetCommand() == nil {
				runs(ctx, sess, hdr, st)
				return
			}
			st.Raw().Write(<-writeRaw) // bytes that are no valid CommandResult frame
			st.CloseSend()
		})))
		conn := h.waitReady("n1")
		good, err := e.srv.Dispatch(t.Context(), "n1", runHeader("good"))
		if err != nil {
			t.Fatal(err)
		}
		defer good.Cancel(quicwire.StreamCancelled)
		ev := new(wirepb.RunEvent)

		for _, c := range cases {
			// The Edge sends a malformed first frame: the Node refuses the
			// stream with protocol_error.
			raw, err := conn.OpenStream(t.Context(), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			raw.Write(c.bytes)
			raw.Close()
			bad := transport.NewStream(raw, "run")
			err = bad.Recv(ev)
			var sc *quicwire.StreamCancelledError
			if !errors.As(err, &sc) || sc.Code != quicwire.StreamProtocolError {
				t.Errorf("%s header: edge read %v, want the stream cancelled with protocol_error", c.name, err)
			}
			if err := good.Recv(ev); err != nil || ev.GetText() != "good" {
				t.Fatalf("%s header broke another stream: %v %v", c.name, ev, err)
			}
		}

		// The Node sends malformed frames back: the Edge's reader names the
		// protocol error and cancels that stream.
		for _, c := range cases {
			ds, err := e.srv.Dispatch(t.Context(), "n1", &wirepb.StreamHeader{Kind: &wirepb.StreamHeader_Command{
				Command: &wirepb.CommandRequest{CommandId: c.name},
			}})
			if err != nil {
				t.Fatal(err)
			}
			writeRaw <- c.bytes
			err = ds.Recv(new(wirepb.CommandResult))
			var pe *transport.ProtocolError
			if !errors.As(err, &pe) || pe.Stream != "command" {
				t.Errorf("%s frame from the node: edge read %v, want a protocol error on the command stream", c.name, err)
			}
			if err := good.Recv(ev); err != nil || ev.GetText() != "good" {
				t.Fatalf("%s frame broke another stream: %v %v", c.name, ev, err)
			}
		}
		if c, err := e.reg.Dispatchable("n1"); err != nil || c != conn {
			t.Fatalf("protocol errors on streams changed the connection: %v %v", c, err)
		}
	})
}

// Decision 3: a malformed frame on the control stream ends the connection
// with protocol_error.
func TestMalformedControlFrameClosesTheConnection(t *testing.T) {
	forEachNetwork(t, func(t *testing.T, h *harness) {
		h.startEdge(0)
		cases := map[string][]byte{
			"oversized registration": append(binary.AppendUvarint(nil, quicwire.MaxControlFrameSize+1), make([]byte, 100)...),
			"garbled registration":   {5, 0xff, 0xff, 0xff, 0xff, 0xff},
			"heartbeat first":        mustFrame(t, transport.AckFor(&wirepb.Heartbeat{Seq: 1})),
		}
		for name, b := range cases {
			qc := h.rawDial()
			st, err := qc.OpenStreamSync(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			st.Write(b)
			select {
			case <-qc.Context().Done():
			case <-time.After(20 * time.Second):
				t.Fatalf("%s: edge kept the connection open", name)
			}
			cc := quicwire.ConnCause(qc)
			if cc == nil || cc.Code != quicwire.CloseProtocolError || !cc.Remote {
				t.Errorf("%s: connection ended with %v, want protocol_error from the edge", name, cc)
			}
		}
		if len(h.current().reg.Snapshot()) != 0 {
			t.Errorf("a malformed registration was registered: %+v", h.current().reg.Snapshot())
		}
	})
}

// rawDial opens a bare QUIC connection to the Edge, as a Node would.
func (h *harness) rawDial() *quic.Conn {
	h.t.Helper()
	tr := &quic.Transport{Conn: h.packetConn()}
	h.t.Cleanup(func() { tr.Close() })
	addr, err := net.ResolveUDPAddr("udp", h.edgeAddr)
	if err != nil {
		h.t.Fatal(err)
	}
	qc, err := tr.Dial(h.t.Context(), addr, quicwire.LoopbackNodeTLSConfig(), transport.NodeQUICConfig(h.live, quicwire.DispatchedStreams(8)))
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { qc.CloseWithError(0, "") })
	return qc
}

func mustFrame(t *testing.T, f *wirepb.ControlFrame) []byte {
	var b bytesWriter
	if err := transport.NewFrameWriter(&b, quicwire.MaxControlFrameSize).Write(f); err != nil {
		t.Fatal(err)
	}
	return b
}

type bytesWriter []byte

func (b *bytesWriter) Write(p []byte) (int, error) { *b = append(*b, p...); return len(p), nil }

// Decision 6: a stream bound to another generation is refused by the Node
// before any handler sees it.
func TestStreamOfAnotherGenerationIsRefused(t *testing.T) {
	forEachNetwork(t, func(t *testing.T, h *harness) {
		h.startEdge(0)
		served := make(chan struct{}, 1)
		h.startNode("n1", withHandler(handlerFunc(func(context.Context, *transport.Session, *wirepb.StreamHeader, *transport.Stream) {
			served <- struct{}{}
		})))
		conn := h.waitReady("n1")
		raw, err := conn.OpenStream(t.Context(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		st := transport.NewStream(raw, "run")
		hdr := runHeader("stale")
		hdr.Generation = conn.Generation() - 1
		if err := st.Send(hdr); err != nil {
			t.Fatal(err)
		}
		var sc *quicwire.StreamCancelledError
		if err := st.Recv(new(wirepb.RunEvent)); !errors.As(err, &sc) || sc.Code != quicwire.StreamRefused {
			t.Errorf("stale-generation stream: %v, want refused", err)
		}
		select {
		case <-served:
			t.Error("a handler served a stream of another generation")
		default:
		}
	})
}
