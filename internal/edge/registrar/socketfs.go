package registrar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// SocketFile is the running Edge's admin socket in its data_dir. `edged
// node` commands talk to the running Edge through it, so that a removal
// fences the Node's live connection at once, and the store has one writer.
// Who may use it is who may open it: the socket is mode 0600 in a 0700
// directory, like the store itself.
const SocketFile = "admin.sock"

// maxSocketPath is the length a Unix socket's path must stay under
// (sun_path is 108 bytes on Linux, 104 on the BSDs).
const maxSocketPath = 104

// ListenSocket binds the admin socket in dataDir (mode 0600), replacing a
// stale one that no process answers on.
func ListenSocket(dataDir string) (net.Listener, error) {
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
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	return ln, nil
}

// NewSocketClient returns a client of the socket in dataDir.
func NewSocketClient(dataDir string) *SocketClient {
	path := filepath.Join(dataDir, SocketFile)
	return &SocketClient{hc: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}}
}
