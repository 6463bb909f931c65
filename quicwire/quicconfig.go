package quicwire

import (
	"time"

	"github.com/quic-go/quic-go"
)

// Flow-control sizing (ARCHITECTURE.md decision 2).
//
// quic-go returns connection-level credit only when the application reads.
// With auto-growing windows, a few streams whose reader stopped reading can
// use up the connection window, and then the control stream stops too while
// the connection itself stays up: heartbeats go unanswered on a healthy link
// (quic-go issue 3294). So windows are fixed (initial = max) and the
// connection window covers every stream that can be open at once at its full
// stream window, plus a reserve:
//
//	ConnectionWindow = (MaxDispatchedStreams + MaxNodeStreams) × StreamWindow + ConnectionReserve
//
// Unread streams can then fill their own windows but never take credit from
// another stream, the control stream included.
const (
	// StreamWindow is the fixed receive window of every stream.
	StreamWindow = 256 << 10
	// MaxDispatchedStreams caps the Edge-opened streams (runs, tunnels,
	// commands) open at once on one connection. The Edge's OpenStreamSync
	// waits for a free slot beyond it.
	MaxDispatchedStreams = 256
	// MaxNodeStreams is how many streams the Node may open: the control
	// stream only.
	MaxNodeStreams = 1
	// ConnectionReserve is extra connection-level credit beyond the sum of
	// stream windows.
	ConnectionReserve = 1 << 20
	// ConnectionWindow is the fixed connection-level receive window.
	ConnectionWindow = (MaxDispatchedStreams+MaxNodeStreams)*StreamWindow + ConnectionReserve
	// HandshakeTimeout bounds the QUIC/TLS handshake.
	HandshakeTimeout = 10 * time.Second
)

// Control stream send priority (RFC 9218 urgency; lower is more urgent).
// Dispatched streams keep quic-go's default urgency of 3.
const controlUrgency = 0

// EdgeQUICConfig is the QUIC configuration of the Edge's listener.
func EdgeQUICConfig(l Liveness) *quic.Config {
	c := baseConfig(l)
	c.MaxIncomingStreams = MaxNodeStreams
	return c
}

// NodeQUICConfig is the QUIC configuration the Node dials with.
func NodeQUICConfig(l Liveness) *quic.Config {
	c := baseConfig(l)
	c.MaxIncomingStreams = MaxDispatchedStreams
	return c
}

func baseConfig(l Liveness) *quic.Config {
	return &quic.Config{
		HandshakeIdleTimeout:           HandshakeTimeout,
		MaxIdleTimeout:                 l.IdleTimeout(),
		KeepAlivePeriod:                l.KeepAlive(),
		InitialStreamReceiveWindow:     StreamWindow,
		MaxStreamReceiveWindow:         StreamWindow,
		InitialConnectionReceiveWindow: ConnectionWindow,
		MaxConnectionReceiveWindow:     ConnectionWindow,
		MaxIncomingUniStreams:          -1,
	}
}
