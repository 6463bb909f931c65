//go:build !unix

package netpeek

import "net"

// Peek cannot tell without a peek here: a connection counts as ended.
func Peek(net.Conn) Readiness { return Ended }

// WaitReadable does not wait here: the read that follows waits instead.
func WaitReadable(net.Conn) error { return nil }
