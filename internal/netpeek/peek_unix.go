//go:build unix

package netpeek

import (
	"net"
	"syscall"
)

// Peek says what c has to read, without waiting and without reading it.
func Peek(c net.Conn) Readiness {
	rc, err := RawConn(c)
	if err != nil {
		return Ended
	}
	r := Ended
	err = rc.Control(func(fd uintptr) { r = peekFD(fd) })
	if err != nil {
		return Ended
	}
	return r
}

// WaitReadable waits until c has something to read (bytes, or its end, or
// an error), with no buffer: the goroutine waits in the runtime's poller.
// The connection's deadlines end the wait as they end a read.
func WaitReadable(c net.Conn) error {
	rc, err := RawConn(c)
	if err == ErrNotSocket {
		return nil // the read that follows waits instead
	}
	if err != nil {
		return err
	}
	return rc.Read(func(fd uintptr) bool { return peekFD(fd) != Nothing })
}

func peekFD(fd uintptr) Readiness {
	var buf [1]byte
	n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK || err == syscall.EINTR:
		return Nothing
	case err == nil && n > 0:
		return Bytes
	}
	return Ended // 0: the peer's end; or an error (a reset)
}
