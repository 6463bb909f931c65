package transport

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
)

// P4: an unreachable destination is a lost packet, not the end of every
// connection to it; any other send error still is an error.
func TestUnreachableSendsAreLossOtherErrorsAreErrors(t *testing.T) {
	wrap := func(errno syscall.Errno) error {
		return &net.OpError{Op: "sendmsg", Net: "udp", Err: os.NewSyscallError("sendmsg", errno)}
	}
	for _, errno := range []syscall.Errno{syscall.ENETUNREACH, syscall.EHOSTUNREACH, syscall.ENETDOWN, syscall.EHOSTDOWN} {
		if !unreachable(wrap(errno)) {
			t.Errorf("%v is not taken for loss", errno)
		}
	}
	for _, err := range []error{nil, wrap(syscall.EPERM), wrap(syscall.EMSGSIZE), net.ErrClosed, errors.New("other")} {
		if unreachable(err) {
			t.Errorf("%v is taken for loss", err)
		}
	}

	// On a real socket: a closed one still fails, a healthy one sends.
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	pc := UnreachableIsLoss(c)
	if _, ok := pc.(interface {
		WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (int, int, error)
		ReadMsgUDP(b, oob []byte) (int, int, int, *net.UDPAddr, error)
		SyscallConn() (syscall.RawConn, error)
	}); !ok {
		t.Fatal("the wrapper hides methods quic-go uses on a *net.UDPConn")
	}
	if n, err := pc.WriteTo([]byte("x"), c.LocalAddr()); n != 1 || err != nil {
		t.Fatalf("send to itself: %d, %v", n, err)
	}
	c.Close()
	if _, err := pc.WriteTo([]byte("x"), c.LocalAddr()); err == nil {
		t.Fatal("a send on a closed socket reported success")
	}
}
