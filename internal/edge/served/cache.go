package served

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/edge/datadir"
)

// staleAfter is how long a memory file in the cache directory may go
// unwritten before an Edge starting beside it deletes it: an Edge that has
// not run for a week has no Nodes to wait for.
const staleAfter = 7 * 24 * time.Hour

// CachePath is where an Edge without data_dir keeps its memory: a file of
// its own in the user's cache directory ($XDG_CACHE_HOME/iop/served, or
// ~/.cache/iop/served), named after the Edge's identity and QUIC address,
// so that the loopback quick start answers "retry", not "not found", after
// a restart too. The directory is made 0700 and checked as data_dir is;
// files there older than a week are deleted. It returns "" and why when
// there is no usable cache directory (the Edge then falls back to the
// start-up grace).
func CachePath(edgeID, quicAddr string) (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(base, "iop", "served")
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return "", err
	}
	if err := datadir.Prepare(dir); err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(edgeID + "\x00" + quicAddr))
	name := "edge-" + hex.EncodeToString(sum[:8]) + ".json"
	pruneCache(dir, name, time.Now())
	return filepath.Join(dir, name), nil
}

// pruneCache deletes the memory files in dir, other than keep, not written
// for staleAfter.
func pruneCache(dir, keep string, now time.Time) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.Name() == keep || !strings.HasPrefix(e.Name(), "edge-") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) > staleAfter {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
