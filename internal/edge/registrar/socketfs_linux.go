package registrar

import (
	"net"

	"golang.org/x/sys/unix"
)

// unixPeerUID asks the kernel who is on the other end of c: SO_PEERCRED
// gives the effective uid of the process that connected (to a listener)
// or that listened (to a client), as it was then.
func unixPeerUID(c *net.UnixConn) (uid int, known bool, err error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, false, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, false, err
	}
	if credErr != nil {
		return 0, false, credErr
	}
	return int(cred.Uid), true, nil
}
