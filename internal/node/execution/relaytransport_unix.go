//go:build unix

package execution

import (
	"net"
	"syscall"
)

// alive reports whether an idle connection is still open: the server has
// neither closed it nor sent anything on it since its last answer. It
// peeks without waiting, so a connection the server closed while idle (a
// keep-alive timeout) is found before a request is written on it.
func alive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, perr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		open = perr == syscall.EAGAIN || perr == syscall.EWOULDBLOCK
		return true
	})
	return err == nil && open
}

// waitReadable waits until c has something to read (or its end, or an
// error), with no buffer: the goroutine waits in the poller. The
// connection's deadlines end the wait as they end a read.
func waitReadable(c net.Conn) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var buf [1]byte
	return rc.Read(func(fd uintptr) bool {
		_, _, perr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return perr != syscall.EAGAIN && perr != syscall.EWOULDBLOCK
	})
}
