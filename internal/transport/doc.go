// Package transport is the machinery the Edge and the Node speak their
// wire with (its contract is package quicwire and docs/protocol.md):
// length-delimited protobuf frames read and written within a size limit
// (FrameReader, FrameWriter, ProtocolError), dispatched streams and the
// control stream (Stream, ControlStream), the heartbeat with its response
// wait (Heartbeat, R8), the watch that suspects a silent peer (SilenceWatch,
// P4), the per-connection session and its health observation sequence
// (Session, R7), and the QUIC configurations whose fixed windows keep the
// control stream alive under load (EdgeQUICConfig, NodeQUICConfig,
// decision 2).
package transport
