package transport

import (
	"net"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/quicwire"
)

// Control stream send priority (RFC 9218 urgency; lower is more urgent).
// Dispatched streams keep quic-go's default urgency of 3.
const controlUrgency = 0

// EdgeQUICConfig is the QUIC configuration of the Edge's listener.
func EdgeQUICConfig(l quicwire.Liveness) *quic.Config {
	c := baseConfig(l, quicwire.MaxDispatchedStreams)
	c.MaxIncomingStreams = quicwire.MaxNodeStreams
	return c
}

// NodeQUICConfig is the QUIC configuration the Node dials with; streams is
// its stream limit, DispatchedStreams of its total capacity.
func NodeQUICConfig(l quicwire.Liveness, streams int) *quic.Config {
	c := baseConfig(l, streams)
	c.MaxIncomingStreams = int64(streams)
	c.KeepAlivePeriod = l.NodeKeepAlive()
	return c
}

func baseConfig(l quicwire.Liveness, streams int) *quic.Config {
	w := quicwire.ConnectionWindow(streams)
	return &quic.Config{
		HandshakeIdleTimeout:           quicwire.HandshakeTimeout,
		MaxIdleTimeout:                 l.IdleTimeout(),
		KeepAlivePeriod:                l.KeepAlive(),
		InitialStreamReceiveWindow:     quicwire.StreamWindow,
		MaxStreamReceiveWindow:         quicwire.StreamWindow,
		InitialConnectionReceiveWindow: w,
		MaxConnectionReceiveWindow:     w,
		MaxIncomingUniStreams:          -1,
	}
}

// EdgeTransport is the QUIC transport of the Edge's listener on conn. key
// is its stateless reset key: a restarted Edge that has the same key
// answers the packets of connections it no longer knows with a stateless
// reset, and their Nodes learn at once that the connection is gone instead
// of waiting out their heartbeat (P4). A key that changes at every start
// gives no such answer; nil sends none at all.
func EdgeTransport(conn net.PacketConn, key *quic.StatelessResetKey) *quic.Transport {
	return &quic.Transport{Conn: conn, StatelessResetKey: key, ConnectionIDLength: quicwire.EdgeConnectionIDLength}
}
