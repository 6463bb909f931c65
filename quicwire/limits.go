package quicwire

import "time"

// The numbers of the contract: how large a frame may be, how many streams
// a Node accepts and with what windows, and the protocol's version. Both
// daemons, and anyone who speaks the wire, keep to them.

// Frame size limits. A frame is the varint length prefix plus the message;
// the limits bound the message.
const (
	// MaxControlFrameSize bounds frames on the control stream, which carries
	// only small messages (registration, heartbeats, status).
	MaxControlFrameSize = 64 << 10
	// MaxStreamFrameSize bounds frames on dispatched (run, tunnel, command)
	// streams.
	MaxStreamFrameSize = 1 << 20
	// MaxBodyChunkSize is the largest body chunk a sender puts in one tunnel
	// frame, well below MaxStreamFrameSize so headers and framing never push
	// a chunk over the limit.
	MaxBodyChunkSize = 64 << 10
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
//	ConnectionWindow(streams) = (streams + MaxNodeStreams) × StreamWindow + ConnectionReserve
//
// Unread streams can then fill their own windows but never take credit from
// another stream, the control stream included.
//
// How many dispatched streams may be open at once is the Node's to say: it
// accepts them, so its QUIC stream limit is DispatchedStreams(capacity), its
// total provider capacity plus StreamHeadroom, and it tells the Edge that
// number at registration (RegisterRequest.max_dispatched_streams) so that
// the Edge never grants more slots on the connection than it can open
// streams for. The Edge cannot know a Node's limit before the handshake, so
// its own connection window covers MaxDispatchedStreams, the largest limit
// any Node may declare. A window is credit, not memory: the Edge only ever
// holds what the streams it opened carry, each at most StreamWindow.
const (
	// StreamWindow is the fixed receive window of every stream.
	StreamWindow = 256 << 10
	// MaxDispatchedStreams is the largest stream limit a Node may declare:
	// its total provider capacity plus StreamHeadroom may not exceed it.
	MaxDispatchedStreams = 16384
	// StreamHeadroom is how many streams a Node accepts beyond its total
	// capacity: for the Edge's metadata calls and commands, which hold no
	// capacity slot, and for streams whose slot is already released while
	// the stream's last frames and its MAX_STREAMS credit are in flight.
	StreamHeadroom = 64
	// LegacyDispatchedStreams is the stream limit of a Node that does not
	// declare one (an older noded): what every Node accepted before the
	// limit followed capacity.
	LegacyDispatchedStreams = 256
	// MaxNodeStreams is how many streams the Node may open: the control
	// stream only.
	MaxNodeStreams = 1
	// ConnectionReserve is extra connection-level credit beyond the sum of
	// stream windows.
	ConnectionReserve = 1 << 20
	// HandshakeTimeout bounds the QUIC/TLS handshake.
	HandshakeTimeout = 10 * time.Second
	// EdgeConnectionIDLength is the length of the connection IDs the Edge
	// issues. Every packet a Node sends carries one, and a longer ID makes
	// the Node's heartbeat packet comfortably larger than the 42 bytes
	// below which quic-go never answers with a stateless reset (RFC 9000
	// §10.3: a reset must be smaller than what provoked it). So the first
	// heartbeat a Node sends to a restarted Edge is answered with a reset,
	// and the Node reconnects at once (P4).
	EdgeConnectionIDLength = 8
)

// DispatchedStreams is the stream limit of a Node whose providers'
// capacities add up to capacity: the capacity plus StreamHeadroom.
func DispatchedStreams(capacity int) int { return capacity + StreamHeadroom }

// ConnectionWindow is the fixed connection-level receive window of a
// connection on which up to streams dispatched streams can be open.
func ConnectionWindow(streams int) uint64 {
	return uint64(streams+MaxNodeStreams)*StreamWindow + ConnectionReserve
}

// ProtocolVersion is the version of the wire this code speaks. The Edge
// refuses a RegisterRequest with another version (CloseRefused).
const ProtocolVersion = 1
