// Package quicwire is the contract of IOP's Edge–Node wire: the protobuf
// messages (package wirepb), how they are framed on QUIC streams and how
// large a frame may be, the codes that close connections and streams, the
// stream limits and windows, the liveness profile, and workload identity
// with its TLS configurations. It knows nothing of scheduling or execution
// policy: edged and noded build those on top.
//
// It exports the contract only. The machinery both daemons speak the wire
// with (the frame reader and writer, stream wrappers, the heartbeat, the
// silence watch, the per-connection session, the QUIC configurations) is
// internal/transport, free to change. IOP's Nodes are IOP's own: a third
// party extends the adapters (package sdk), not the wire; one that wanted
// to speak it would follow docs/protocol.md and the numbers here
// (docs/architecture.md, decision 12).
//
// # The conversation
//
// The Node dials the Edge (Nodes sit behind NAT; the Edge is the one
// reachable address) and the TLS handshake proves both identities (S3). Then:
//
//	Node                                           Edge
//	 │ open control stream (the Node's first bidirectional stream)
//	 │── RegisterRequest{node_id, version, providers, lease key} ─►│
//	 │◄─ RegisterResponse{accepted, generation, signing key} ──────│ new generation;
//	 │                                                             │ an older connection
//	 │                                                             │ of the node is fenced
//	 │── NodeReadyRequest{generation, providers} ─────────────────►│
//	 │◄─ NodeReadyResponse{generation} ────────────────────────────│ now dispatchable (R1)
//	 │                                                             │
//	 │◄──────── Heartbeat / HeartbeatAck, both ways, ─────────────►│ every 30 s; an ack
//	 │          ProviderStatusUpdate, DrainNotice (Node→Edge),     │ later than 45 s closes
//	 │          CredentialNotice (Edge→Node)                       │ with heartbeat_timeout
//	 │                                                             │
//	 │◄─ Edge opens one stream per run, tunnel, command or embed ──│
//	 │   first frame: StreamHeader{generation, run|tunnel|command| │
//	 │                embed}                                       │
//	 │   then RunEvent... | TunnelFrame... | one CommandResult |   │
//	 │        EmbedFrame...                                        │
//
// Later on the control stream, when the Edge renews certificates, the Node
// sends CertificateRequest{csr} before its certificate expires and gets one
// CertificateResponse; the connection goes on. A Node without a
// certificate first joins on its own connection with ALPN iop-join/1
// (package quicwire/enroll).
//
// Every frame is a varint length followed by one protobuf message (the
// encoding of google.golang.org/protobuf/encoding/protodelim), with a hard
// size limit that depends on the stream: MaxControlFrameSize on the control
// stream, MaxStreamFrameSize on dispatched streams. A frame over the limit,
// cut short, or unparsable is a protocol error (transport.ProtocolError):
// it ends that stream (the connection, if it was the control stream), never
// the process.
//
// Connections are closed with a CloseCode (heartbeat_timeout, superseded,
// shutdown, protocol_error, unauthenticated, ...) carried as the QUIC
// application error code, so the peer learns why. Dispatched streams are
// cancelled with a StreamCode.
package quicwire
