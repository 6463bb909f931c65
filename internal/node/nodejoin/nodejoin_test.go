package nodejoin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/iop-dev/iop/quicwire/enroll"
)

const validToken = "iop1.AAAAAAAA.AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"

// What can be refused before dialling the Edge is, and nothing is written.
func TestJoinRefusesBeforeDialling(t *testing.T) {
	joined := t.TempDir()
	if err := os.WriteFile(filepath.Join(joined, ConfigFile), []byte("node_id: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(t.TempDir(), "node")
	for _, tc := range []struct {
		name string
		opts Options
		is   error
		want string
	}{
		{"malformed token", Options{EdgeAddr: "127.0.0.1:7443", Token: "iop1.x", Dir: fresh}, enroll.ErrMalformedToken, "--token"},
		{"no port", Options{EdgeAddr: "edge.example.com", Token: validToken, Dir: fresh}, nil, "want HOST:PORT"},
		{"already joined", Options{EdgeAddr: "127.0.0.1:7443", Token: validToken, Dir: joined}, ErrAlreadyJoined, "use another --dir"},
	} {
		_, err := Join(context.Background(), tc.opts)
		if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %v saying %q", tc.name, err, tc.is, tc.want)
		}
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Errorf("a refused join made %s", fresh)
	}
}
