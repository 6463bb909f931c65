// Package netpeek tells what a connection has to read without reading it,
// and waits for it without a buffer: a peek (MSG_PEEK) at the socket, so
// the bytes stay for whoever reads the connection next. The Node's relay
// uses it to find an idle connection the server closed and to wait for an
// answer holding no read buffer; the Edge's front door, to watch the
// connections of requests it took from net/http.
package netpeek

import (
	"errors"
	"net"
	"syscall"
)

// Readiness is what a connection has to read.
type Readiness uint8

const (
	// Nothing: nothing to read yet; the connection is open.
	Nothing Readiness = iota
	// Bytes: bytes are waiting to be read.
	Bytes
	// Ended: the peer closed the connection (a read would return its
	// end), or it failed (a reset), or it cannot be peeked at.
	Ended
)

// ErrNotSocket: the connection has no descriptor to peek at.
var ErrNotSocket = errors.New("not a socket")

// RawConn is c's socket, for calls on its descriptor.
func RawConn(c net.Conn) (syscall.RawConn, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, ErrNotSocket
	}
	return sc.SyscallConn()
}
