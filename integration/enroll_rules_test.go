package integration

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// S3, issue 24 gap 3: a removal is final until an operator lifts it. After
// `edged node remove`, `edged node add` of the id is refused naming `edged
// node restore`, and neither the Node's joined certificate nor one made by
// hand for its id (`edged tls cert create --node`) is admitted. `edged
// node restore` lifts the removal and says so, but lets nothing old in:
// both certificates stay refused, and the Node comes back only by joining
// again with a new token.
func TestARemovalIsFinalUntilRestoreLiftsIt(t *testing.T) {
	fake := fakeollama.New(fakeollama.Model{Name: "tiny:latest", Text: "hello"})
	t.Cleanup(fake.Close)
	e := enrollSetup(t, false)
	// A certificate of n1 made by hand with the CA key, before the removal.
	if out, err := run(t, e.dir, bin.edged, "tls", "cert", "create", "--node", "n1"); err != nil {
		t.Fatalf("edged tls cert create --node n1: %v\n%s", err, out)
	}
	handConf := filepath.Join(e.dir, "hand-n1.yaml")
	writeFile(t, handConf, fmt.Sprintf(`
node_id: n1
edge: {address: %q}
identity: {mode: mtls, trust_domain: iop.test, edge_id: edge-1, ca_file: iop-ca.pem, cert_file: node-n1.pem, key_file: node-n1-key.pem}
lease_key_file: hand-lease.key
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
`, e.quic))
	e.start()
	addr, token, _ := e.add("n1")
	joined := start(t, "noded join", bin.noded, append(joinArgs(addr, token, filepath.Join(t.TempDir(), "node"), fake), "--start")...)
	first := waitNode(t, e.base, "n1", "ready", func(n nodeView) bool { return n.State == "ready" })

	if out, err := run(t, e.dir, bin.edged, "node", "remove", "n1", "--config", e.conf); err != nil {
		t.Fatalf("edged node remove: %v\n%s", err, out)
	} else if !strings.Contains(out, "edged node restore n1") {
		t.Errorf("edged node remove should say how the removal is lifted:\n%s", out)
	}
	waitNode(t, e.base, "n1", "fenced", func(n nodeView) bool { return n.State == "fenced" })

	// The id gets no token while removed.
	out, err := run(t, e.dir, bin.edged, "node", "add", "n1", "--config", e.conf)
	if err == nil || !strings.Contains(out, "node n1 was removed") || !strings.Contains(out, "edged node restore n1") || strings.Contains(out, "--token") {
		t.Fatalf("edged node add of a removed node: err=%v, want refused naming edged node restore\n%s", err, out)
	}
	// Nor is a hand-made certificate of its id admitted.
	hand := start(t, "noded (hand-made certificate)", bin.noded, "run", "--config", handConf)
	hand.waitOutput(regexp.MustCompile(`edge refused registration \(unauthenticated\): node n1 was removed`))

	out, err = run(t, e.dir, bin.edged, "node", "restore", "n1", "--config", e.conf)
	if err != nil || !strings.Contains(out, "Lifted the removal of node n1") || !strings.Contains(out, "stay revoked") {
		t.Fatalf("edged node restore: err=%v\n%s", err, out)
	}
	if out, err := run(t, e.dir, bin.edged, "node", "restore", "n1", "--config", e.conf); err == nil || !strings.Contains(out, "not removed") {
		t.Errorf("edged node restore of a node not removed: err=%v\n%s", err, out)
	}

	// Lifting lets nothing old in: the joined certificate stays revoked,
	// the hand-made one from before the removal stays refused.
	joined.waitOutput(regexp.MustCompile(`edge refused registration \(unauthenticated\): certificate \S+ of node n1 was revoked`))
	hand.waitOutput(regexp.MustCompile(`edge refused registration \(unauthenticated\): certificate \S+ of node n1 starts at \S+, before the node's removal`))

	// A new join brings it back.
	addr, token, _ = e.add("n1")
	start(t, "noded join again", bin.noded, append(joinArgs(addr, token, filepath.Join(t.TempDir(), "again"), fake), "--start")...)
	again := waitNode(t, e.base, "n1", "ready again", func(n nodeView) bool { return n.State == "ready" && n.Generation > first.Generation })
	if again.Identity != "spiffe://iop.test/node/n1" {
		t.Errorf("identity %q after the new join", again.Identity)
	}
	l := e.list()
	if len(l) != 1 || !l[0].Removed.IsZero() || len(l[0].Certificates) != 2 || l[0].Certificates[0].Revoked.IsZero() || !l[0].Certificates[1].Revoked.IsZero() {
		t.Errorf("node list: %+v, want n1 not removed, its first certificate revoked, the new one not", l)
	}
}
