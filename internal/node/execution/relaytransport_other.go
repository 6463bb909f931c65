//go:build !unix

package execution

import "net"

// alive cannot tell without a peek: an idle connection is not reused.
func alive(net.Conn) bool { return false }

// waitReadable does not wait here: the read buffer is made at once.
func waitReadable(net.Conn) error { return nil }
