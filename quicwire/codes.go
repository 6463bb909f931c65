package quicwire

import (
	"context"
	"errors"
	"fmt"

	"github.com/quic-go/quic-go"
)

// CloseCode says why a connection was closed. It travels as the QUIC
// application error code of CONNECTION_CLOSE, so the peer sees it too.
type CloseCode quic.ApplicationErrorCode

// Close codes. The values are part of the wire; never renumber.
const (
	// CloseNormal: closed without a fault (the peer asked, or both agreed).
	CloseNormal CloseCode = 0x0
	// CloseHeartbeatTimeout: a heartbeat was not answered within the
	// liveness profile's response wait (R9).
	CloseHeartbeatTimeout CloseCode = 0x101
	// CloseSuperseded: the same Node connected again; this older
	// generation is fenced (R9).
	CloseSuperseded CloseCode = 0x102
	// CloseShutdown: the closing side is shutting down (after a drain).
	CloseShutdown CloseCode = 0x103
	// CloseProtocolError: the peer broke the wire protocol on the control
	// stream.
	CloseProtocolError CloseCode = 0x104
	// CloseUnauthenticated: the peer's identity was not acceptable (S3).
	CloseUnauthenticated CloseCode = 0x105
	// CloseRefused: registration refused for a reason other than identity,
	// such as an unsupported protocol version or an invalid node id.
	CloseRefused CloseCode = 0x106
	// CloseInternal: the closing side failed.
	CloseInternal CloseCode = 0x107
)

var closeNames = map[CloseCode]string{
	CloseNormal:           "normal",
	CloseHeartbeatTimeout: "heartbeat_timeout",
	CloseSuperseded:       "superseded",
	CloseShutdown:         "shutdown",
	CloseProtocolError:    "protocol_error",
	CloseUnauthenticated:  "unauthenticated",
	CloseRefused:          "refused",
	CloseInternal:         "internal",
}

// String returns the code's name, as used in logs, metrics and the admin API.
func (c CloseCode) String() string {
	if n, ok := closeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("close_code_%#x", uint64(c))
}

// Close closes conn with code and a short human-readable detail.
func (c CloseCode) Close(conn *quic.Conn, detail string) error {
	return conn.CloseWithError(quic.ApplicationErrorCode(c), detail)
}

// ConnClosedError is how a connection ended, as seen from one side.
type ConnClosedError struct {
	// Code is the application close code, when the connection was closed
	// by either side with one. For transport-level ends (idle timeout,
	// stateless reset, handshake failure) Code is CloseInternal and
	// Transport holds the quic-go error.
	Code CloseCode
	// Remote says whether the peer closed the connection.
	Remote bool
	// Detail is the close message, if any.
	Detail string
	// Transport is the underlying error for non-application ends.
	Transport error
}

func (e *ConnClosedError) Error() string {
	if e.Transport != nil {
		return "connection lost: " + e.Transport.Error()
	}
	who := "locally"
	if e.Remote {
		who = "by the peer"
	}
	if e.Detail != "" {
		return fmt.Sprintf("connection closed %s: %s (%s)", who, e.Code, e.Detail)
	}
	return fmt.Sprintf("connection closed %s: %s", who, e.Code)
}

// Unwrap returns the transport error, if any.
func (e *ConnClosedError) Unwrap() error { return e.Transport }

// Is makes errors.Is(err, ErrDisconnected) hold for every connection end.
func (e *ConnClosedError) Is(target error) bool { return target == ErrDisconnected }

// ErrDisconnected matches (errors.Is) every error caused by the end of the
// connection a stream was on: the disconnect outcome of R9.
var ErrDisconnected = errors.New("disconnected")

// CloseReason classifies err as the end of a connection. It reports false
// for errors that are not about the connection.
func CloseReason(err error) (*ConnClosedError, bool) {
	var cc *ConnClosedError
	if errors.As(err, &cc) {
		return cc, true
	}
	var ae *quic.ApplicationError
	if errors.As(err, &ae) {
		return &ConnClosedError{Code: CloseCode(ae.ErrorCode), Remote: ae.Remote, Detail: ae.ErrorMessage}, true
	}
	var (
		idle  *quic.IdleTimeoutError
		hs    *quic.HandshakeTimeoutError
		reset *quic.StatelessResetError
		te    *quic.TransportError
	)
	if errors.As(err, &idle) || errors.As(err, &hs) || errors.As(err, &reset) || errors.As(err, &te) {
		return &ConnClosedError{Code: CloseInternal, Transport: err}, true
	}
	return nil, false
}

// ConnCause returns why conn ended, or nil while it is open.
func ConnCause(conn *quic.Conn) *ConnClosedError {
	ctx := conn.Context()
	if ctx.Err() == nil {
		return nil
	}
	if cc, ok := CloseReason(context.Cause(ctx)); ok {
		return cc
	}
	return &ConnClosedError{Code: CloseInternal, Transport: context.Cause(ctx)}
}

// StreamCode says why a dispatched stream was cancelled (RESET_STREAM /
// STOP_SENDING). Cancelling a stream ends that stream only.
type StreamCode quic.StreamErrorCode

// Stream codes. The values are part of the wire; never renumber.
const (
	// StreamDone: the reader needs no more data; not a failure.
	StreamDone StreamCode = 0x0
	// StreamCancelled: the work on the stream was cancelled (R10).
	StreamCancelled StreamCode = 0x201
	// StreamProtocolError: a malformed or unexpected frame.
	StreamProtocolError StreamCode = 0x202
	// StreamRefused: the receiver will not take this stream: it is bound
	// to another generation, or nothing serves streams yet. (A draining
	// receiver answers StreamShutdown; a stream of unknown kind is a
	// StreamProtocolError.)
	StreamRefused StreamCode = 0x203
	// StreamShutdown: the receiver is shutting down.
	StreamShutdown StreamCode = 0x204
	// StreamTooLarge: the sender tried to send a frame over the limit.
	StreamTooLarge StreamCode = 0x205
	// StreamBusy: the Node refuses a run, tunnel or embedding call before
	// its first byte because every capacity slot of its provider is taken
	// (issue 22: a Node's slots are shared by every Edge it is connected
	// to, so an Edge's own count may be behind). Nothing ran; the Edge
	// moves the work to another candidate or back to its queue. A Node
	// sends it only to an Edge that registered it reads it
	// (RegisterResponse.busy_refusals).
	StreamBusy StreamCode = 0x206
)

var streamNames = map[StreamCode]string{
	StreamDone:          "done",
	StreamCancelled:     "cancelled",
	StreamProtocolError: "protocol_error",
	StreamRefused:       "refused",
	StreamShutdown:      "shutdown",
	StreamTooLarge:      "too_large",
	StreamBusy:          "busy",
}

// String returns the code's name.
func (c StreamCode) String() string {
	if n, ok := streamNames[c]; ok {
		return n
	}
	return fmt.Sprintf("stream_code_%#x", uint64(c))
}

// StreamCancelledError is returned when a peer (or this side) cancelled a
// stream with a code.
type StreamCancelledError struct {
	Code   StreamCode
	Remote bool
}

func (e *StreamCancelledError) Error() string {
	if e.Remote {
		return "stream cancelled by the peer: " + e.Code.String()
	}
	return "stream cancelled: " + e.Code.String()
}
