package registrar

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/edge/datadir"
)

// SocketFile is the running Edge's admin socket in its data_dir. `edged
// node` commands talk to the running Edge through it, so that a removal
// fences the Node's live connection at once, and the store has one writer.
//
// The socket is for the Edge's own user (and root), and both ends check
// it. The Edge starts only on a data_dir no one else can change (see
// internal/edge/datadir), so no one else can replace the socket file under
// it; the file is mode 0600; and the Edge asks the kernel who each caller
// is (SO_PEERCRED) and refuses any other user. The client (`edged node`)
// trusts the socket only if its file belongs to the client's own user or
// root, and only if the process on the other end runs as one of those:
// a socket put in place by anyone else, which would answer "removed" to a
// removal it never made, is refused before a request is sent.
const SocketFile = "admin.sock"

// maxSocketPath is the length a Unix socket's path must stay under
// (sun_path is 108 bytes on Linux, 104 on the BSDs).
const maxSocketPath = 104

// ErrUntrustedSocket is a SocketClient's error when the admin socket, or
// the process serving it, belongs to a user other than the caller and
// root: it is not the caller's Edge.
var ErrUntrustedSocket = errors.New("untrusted admin socket")

// maxRefusing bounds the callers of another user being answered at once;
// past it they are cut off without an answer. refuseWithin bounds each.
const (
	maxRefusing  = 4
	refuseWithin = 2 * time.Second
)

// SocketListener is the admin socket's listener: it hands Accept only
// connections of the Edge's user or root, and answers others with a
// refusal.
type SocketListener struct {
	net.Listener
	// Refused, if set before the first Accept, is told of each caller of
	// another user (its uid) that the listener refused.
	Refused func(uid int)

	// The refusals being answered: at most maxRefusing, each its own
	// goroutine, which Close cuts short and waits for.
	refusing chan struct{}
	mu       sync.Mutex
	closed   bool
	answered map[net.Conn]struct{}
	wg       sync.WaitGroup
}

// ListenSocket binds the admin socket in dataDir (mode 0600), replacing a
// stale one that no process answers on.
func ListenSocket(dataDir string) (*SocketListener, error) {
	path := filepath.Join(dataDir, SocketFile)
	if len(path) >= maxSocketPath {
		return nil, fmt.Errorf("admin socket %s: the path is %d bytes, Unix sockets take fewer than %d: use a shorter data_dir", path, len(path), maxSocketPath)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("admin socket %s: another edged is running with this data_dir", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	// Between the bind and the chmod the socket has the umask's mode; in a
	// data_dir others cannot enter that does not matter, and each caller's
	// user is checked at Accept anyway.
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	if err := os.Chmod(path, datadir.FileMode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	return &SocketListener{Listener: ln, refusing: make(chan struct{}, maxRefusing), answered: map[net.Conn]struct{}{}}, nil
}

// Accept returns the next connection of the Edge's user or root. A caller
// of another user is answered 403, saying why, and not returned.
func (l *SocketListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid, known, err := peerUID(c)
		if err != nil {
			c.Close() // the caller is gone already, or the kernel cannot say: no answer
			continue
		}
		if !known || datadir.Trusted(uid) {
			return c, nil
		}
		if l.Refused != nil {
			l.Refused(uid)
		}
		select {
		case l.refusing <- struct{}{}:
			_ = c.SetDeadline(time.Now().Add(refuseWithin))
			l.mu.Lock()
			if l.closed { // no goroutine may start once Close waits
				l.mu.Unlock()
				c.Close()
				<-l.refusing
				return nil, net.ErrClosed
			}
			l.answered[c] = struct{}{}
			l.wg.Go(func() {
				refuse(c, uid)
				l.mu.Lock()
				delete(l.answered, c)
				l.mu.Unlock()
				<-l.refusing
			})
			l.mu.Unlock()
		default:
			c.Close()
		}
	}
}

// Close stops accepting, cuts the refusals being answered short and waits
// for them.
func (l *SocketListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	l.closed = true
	for c := range l.answered {
		_ = c.SetDeadline(time.Now())
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

// refuse answers c's request with a 403 that says who may use the socket,
// within c's deadline. It reads the request first: closing a Unix socket
// with unread data resets it, and the caller would see that instead of the
// answer.
func refuse(c net.Conn, uid int) {
	defer c.Close()
	req, err := http.ReadRequest(bufio.NewReader(io.LimitReader(c, maxSocketBody)))
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(req.Body, maxSocketBody))
	me := os.Geteuid()
	owner := "root, the Edge's user"
	if me != 0 {
		owner = fmt.Sprintf("the Edge's user, %s (uid %d), and root", datadir.UserName(me), me)
	}
	body, _ := json.Marshal(map[string]string{"error": fmt.Sprintf(
		"the admin socket is for %s: you are uid %d (%s); run edged node commands as %s",
		owner, uid, datadir.UserName(uid), datadir.UserName(me))})
	resp := &http.Response{
		StatusCode: http.StatusForbidden, ProtoMajor: 1, ProtoMinor: 1, Close: true,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
	}
	_ = resp.Write(c)
}

// NewSocketClient returns a client of the socket in dataDir.
func NewSocketClient(dataDir string) *SocketClient {
	path := filepath.Join(dataDir, SocketFile)
	return &SocketClient{hc: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dialSocket(ctx, path) },
	}}}
}

// dialSocket connects to the admin socket at path if it is the caller's
// Edge's: the file a socket owned by the caller's user or root, and the
// process on the other end running as one of those. No socket there is
// fs.ErrNotExist (no Edge runs).
func dialSocket(ctx context.Context, path string) (net.Conn, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return nil, fmt.Errorf("%w: %s is not a socket (%s): the Edge makes it a socket; someone who can write to %s put this there",
			ErrUntrustedSocket, path, fi.Mode().Type(), filepath.Dir(path))
	}
	if uid, ok := datadir.Owner(fi); ok && !datadir.Trusted(uid) {
		return nil, untrusted(path, "is owned by", uid)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	uid, known, err := peerUID(c)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("admin socket %s: who serves it: %w", path, err)
	}
	if known && !datadir.Trusted(uid) {
		c.Close()
		return nil, untrusted(path, "is served by a process of", uid)
	}
	return c, nil
}

// untrusted is ErrUntrustedSocket for a socket at path that belongs to uid.
func untrusted(path, how string, uid int) error {
	trusted := "root (you)"
	if me := os.Geteuid(); me != 0 {
		trusted = fmt.Sprintf("you (%s, uid %d) or root", datadir.UserName(me), me)
	}
	return fmt.Errorf("%w: %s %s uid %d (%s), not %s, so it is not your Edge's, and nothing was sent to it. "+
		"If your Edge runs as uid %d, run edged node commands as that user; if not, someone who can write to %s replaced the Edge's socket: make the directory the Edge's alone and restart the Edge, which checks it",
		ErrUntrustedSocket, path, how, uid, datadir.UserName(uid), trusted, uid, filepath.Dir(path))
}

// errNoPeer is peerUID's error when the connection is not a Unix socket.
var errNoPeer = errors.New("not a Unix socket connection")

// peerUID is the uid of the process on the other end of c, known only
// where the kernel tells (socketfs_linux.go); elsewhere only the socket
// file's owner is checked.
func peerUID(c net.Conn) (uid int, known bool, err error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, false, errNoPeer
	}
	return unixPeerUID(uc)
}
