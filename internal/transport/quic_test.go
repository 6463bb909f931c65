package transport_test

import (
	"fmt"
	"testing"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/quic-go/quic-go"
)

// Flow control (ARCHITECTURE decision 2): fixed windows, and a connection
// window that covers every stream at its full window plus a reserve, so
// unread data streams never starve the control stream and heartbeats get
// through under any load (R8). The Node's stream limit follows its capacity
// (issue 10 item 4): every slot it offers can open its stream.
func TestQUICConfigsKeepTheControlStreamAlive(t *testing.T) {
	if quicwire.ConnectionReserve <= 0 {
		t.Fatalf("ConnectionReserve = %d, want positive", quicwire.ConnectionReserve)
	}
	if got := quicwire.DispatchedStreams(300); got != 300+quicwire.StreamHeadroom || quicwire.StreamHeadroom <= 0 {
		t.Fatalf("DispatchedStreams(300) = %d, want the capacity plus a positive headroom", got)
	}
	for _, l := range []quicwire.Liveness{quicwire.DefaultLiveness, quicwire.DefaultLiveness.Scaled(30)} {
		for _, side := range []struct {
			name     string
			cfg      *quic.Config
			incoming int64
			streams  int // dispatched streams whose windows the connection window covers
		}{
			{"edge", transport.EdgeQUICConfig(l), quicwire.MaxNodeStreams, quicwire.MaxDispatchedStreams},
			{"node/capacity 4", transport.NodeQUICConfig(l, quicwire.DispatchedStreams(4)), int64(quicwire.DispatchedStreams(4)), quicwire.DispatchedStreams(4)},
			{"node/capacity 4096", transport.NodeQUICConfig(l, quicwire.DispatchedStreams(4096)), int64(quicwire.DispatchedStreams(4096)), quicwire.DispatchedStreams(4096)},
		} {
			t.Run(fmt.Sprintf("%s/%v", side.name, l.Interval), func(t *testing.T) {
				c := side.cfg
				if c.InitialStreamReceiveWindow != quicwire.StreamWindow || c.MaxStreamReceiveWindow != quicwire.StreamWindow {
					t.Errorf("stream window initial %d max %d, want both fixed at %d", c.InitialStreamReceiveWindow, c.MaxStreamReceiveWindow, quicwire.StreamWindow)
				}
				want := uint64(side.streams+quicwire.MaxNodeStreams)*quicwire.StreamWindow + quicwire.ConnectionReserve
				if c.InitialConnectionReceiveWindow != want || c.MaxConnectionReceiveWindow != want {
					t.Errorf("connection window initial %d max %d, want both fixed at %d (%d streams of %d plus the reserve)",
						c.InitialConnectionReceiveWindow, c.MaxConnectionReceiveWindow, want, side.streams+quicwire.MaxNodeStreams, quicwire.StreamWindow)
				}
				if c.MaxIncomingStreams != side.incoming {
					t.Errorf("MaxIncomingStreams = %d, want %d", c.MaxIncomingStreams, side.incoming)
				}
				// quic-go: zero means its default of 100; negative means none.
				if c.MaxIncomingUniStreams >= 0 {
					t.Errorf("MaxIncomingUniStreams = %d, want negative (no unidirectional streams)", c.MaxIncomingUniStreams)
				}
				if c.MaxIdleTimeout <= l.Interval+l.ResponseWait {
					t.Errorf("MaxIdleTimeout %v <= Interval+ResponseWait %v: QUIC would end the connection before the heartbeat names the reason",
						c.MaxIdleTimeout, l.Interval+l.ResponseWait)
				}
				// P4: a healthy peer is heard from several times per
				// suspicion window, idle or not.
				if c.KeepAlivePeriod <= 0 || 3*c.KeepAlivePeriod > l.SuspectAfter() {
					t.Errorf("KeepAlivePeriod %v, want positive and at most a third of SuspectAfter %v", c.KeepAlivePeriod, l.SuspectAfter())
				}
				if c.HandshakeIdleTimeout != quicwire.HandshakeTimeout {
					t.Errorf("HandshakeIdleTimeout = %v, want %v", c.HandshakeIdleTimeout, quicwire.HandshakeTimeout)
				}
			})
		}
	}
	// Each call returns a fresh config: a caller's tweak must not leak into
	// the other side's or the next connection's.
	a, b := transport.EdgeQUICConfig(quicwire.DefaultLiveness), transport.EdgeQUICConfig(quicwire.DefaultLiveness)
	if a == b {
		t.Fatal("EdgeQUICConfig returned a shared *quic.Config")
	}
}
