package transport

import (
	"errors"
	"net"
	"syscall"
)

// UnreachableIsLoss wraps the Edge's UDP socket so that a send the kernel
// refuses because it has no route to the peer right now (ENETUNREACH,
// EHOSTUNREACH, ENETDOWN, EHOSTDOWN) is a lost packet, as it would be one
// hop later, instead of an error. quic-go closes a connection at its first
// send error, so without this a flap of the Edge's own interface or route
// would fence every Node behind it within one keep-alive, with reason
// internal; with it, those Nodes turn suspect and the heartbeat decides, as
// for any other silent link (P4, R9). Every other error is returned as is.
//
// The wrapper keeps every method of *net.UDPConn that quic-go uses (batched
// and GSO writes, ECN, receive buffers), so nothing is lost on the fast
// path.
func UnreachableIsLoss(c *net.UDPConn) net.PacketConn { return lossyUDP{c} }

type lossyUDP struct{ *net.UDPConn }

func (c lossyUDP) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (int, int, error) {
	n, oobn, err := c.UDPConn.WriteMsgUDP(b, oob, addr)
	if unreachable(err) {
		return len(b), len(oob), nil
	}
	return n, oobn, err
}

func (c lossyUDP) WriteTo(b []byte, addr net.Addr) (int, error) {
	n, err := c.UDPConn.WriteTo(b, addr)
	if unreachable(err) {
		return len(b), nil
	}
	return n, err
}

// unreachable reports whether err is the kernel saying there is no route
// to the destination now.
func unreachable(err error) bool {
	return err != nil && (errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETDOWN) || errors.Is(err, syscall.EHOSTDOWN))
}
