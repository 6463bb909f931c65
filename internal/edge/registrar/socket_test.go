package registrar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	wireenroll "github.com/iop-dev/iop/quicwire/enroll"
)

// serveSocket serves f's Service on its data_dir's admin socket for the
// test, and returns a client of it.
func serveSocket(t *testing.T, f *fixture) *SocketClient {
	t.Helper()
	ln, err := ListenSocket(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.svc.ServeSocket(ctx, ln, f.svc.log) }()
	t.Cleanup(func() { cancel(); <-done })
	return NewSocketClient(f.dir)
}

func TestTheAdminSocketAddsRemovesAndLists(t *testing.T) {
	f := newFixture(t)
	c := serveSocket(t, f)
	if fi, err := os.Stat(filepath.Join(f.dir, SocketFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v, want mode 0600", fi.Mode(), err)
	}
	res, err := c.AddToken("gpu-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := wireenroll.ParseToken(res.Token)
	if err != nil || !tok.MatchesCA(f.ca.Cert) || res.NodeID != "gpu-1" {
		t.Errorf("token %+v: %v", res, err)
	}
	if _, err := c.AddToken("bad id!", time.Hour); err == nil || !strings.Contains(err.Error(), "invalid id") {
		t.Errorf("bad node id: %v", err)
	}
	if _, err := c.AddToken("gpu-1", 8*24*time.Hour); err == nil || !strings.Contains(err.Error(), "--ttl") {
		t.Errorf("ttl over a week: %v", err)
	}
	list, err := c.List()
	if err != nil || len(list) != 1 || len(list[0].Tokens) != 1 {
		t.Errorf("list: %+v %v", list, err)
	}
	if _, err := c.Remove("gpu-1"); err != nil {
		t.Errorf("remove: %v", err)
	}
	if _, err := c.Remove("nobody"); !errors.Is(err, ErrUnknownNode) || strings.Count(err.Error(), "no such node") != 1 {
		t.Errorf("remove unknown: %v, want ErrUnknownNode said once", err)
	}
}

// A running Edge without the CA key refuses to make tokens it would not
// honour, whatever the file says now.
func TestARunningEdgeWithoutTheCAKeyMakesNoTokens(t *testing.T) {
	f := newFixture(t)
	f.svc.opts.CA = nil
	c := serveSocket(t, f)
	if _, err := c.AddToken("gpu-1", time.Hour); err == nil || !strings.Contains(err.Error(), "enrollment.ca_key_file") {
		t.Errorf("add: %v", err)
	}
}

func TestNoEdgeOnTheSocketIsSaidSo(t *testing.T) {
	dir := t.TempDir()
	if _, err := NewSocketClient(dir).List(); !errors.Is(err, ErrNoEdge) {
		t.Errorf("no socket: %v", err)
	}
	// A socket left by an Edge that died answers nobody: it is no Edge,
	// and the next Edge replaces it.
	ln, err := net.Listen("unix", filepath.Join(dir, SocketFile))
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if _, err := NewSocketClient(dir).List(); !errors.Is(err, ErrNoEdge) {
		t.Errorf("stale socket: %v", err)
	}
	ln, err = ListenSocket(dir)
	if err != nil {
		t.Fatalf("replacing a stale socket: %v", err)
	}
	defer ln.Close()
	// A live one is not taken over.
	if _, err := ListenSocket(dir); err == nil || !strings.Contains(err.Error(), "another edged") {
		t.Errorf("second listener: %v", err)
	}
}

// Issue 24 gap 7: `edged node list` works whatever the store holds: 10,000
// certificate records of 500 Nodes (two weeks of a fleet's renewals, past
// what one answer of the old admin socket could carry) all reach the
// client.
func TestTheAdminSocketListsTenThousandRecords(t *testing.T) {
	f := newFixture(t)
	const nodes, perNode = 500, 20
	err := f.st.db.Update(func(tx *bolt.Tx) error {
		for i := range nodes * perNode {
			id := fmt.Sprintf("gpu-%03d", i%nodes)
			nb := f.now.Add(time.Duration(i) * time.Second)
			c := CertRecord{Serial: fmt.Sprintf("%032x", i+1), NodeID: id, NotBefore: nb, NotAfter: nb.Add(24 * time.Hour), Via: "renew"}
			if err := put(tx, bucketCerts, c.Serial, c); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c := serveSocket(t, f)
	list, err := c.List()
	if err != nil {
		t.Fatalf("list of %d records: %v", nodes*perNode, err)
	}
	certs := 0
	for _, n := range list {
		certs += len(n.Certificates)
	}
	if len(list) != nodes || certs != nodes*perNode {
		t.Errorf("listed %d nodes, %d certificates; want %d, %d", len(list), certs, nodes, nodes*perNode)
	}
}

// S3, issue 24 gap 3: the removal's errors keep their identity across the
// socket, so `edged node add` of a removed Node and `edged node restore`
// of one that is not removed fail as the Edge decided.
func TestTheAdminSocketRefusesATokenForARemovedNodeUntilRestored(t *testing.T) {
	f := newFixture(t)
	c := serveSocket(t, f)
	if _, err := c.AddToken("gpu-1", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Remove("gpu-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddToken("gpu-1", time.Hour); !errors.Is(err, ErrNodeRemoved) || !strings.Contains(err.Error(), "edged node restore gpu-1") {
		t.Errorf("token for a removed node: %v", err)
	}
	res, err := c.Restore("gpu-1")
	if err != nil || res.NodeID != "gpu-1" || !res.Removed.Equal(f.now) {
		t.Fatalf("restore: %+v %v, want removed at %s", res, err, f.now)
	}
	if _, err := c.Restore("gpu-1"); !errors.Is(err, ErrNotRemoved) {
		t.Errorf("restore again: %v, want ErrNotRemoved", err)
	}
	if _, err := c.Restore("nobody"); !errors.Is(err, ErrUnknownNode) {
		t.Errorf("restore of an unknown node: %v, want ErrUnknownNode", err)
	}
	if _, err := c.AddToken("gpu-1", time.Hour); err != nil {
		t.Errorf("token after the restore: %v", err)
	}
}
