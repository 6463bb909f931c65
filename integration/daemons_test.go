package integration

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README's first command: `go run ./edged/dev` starts an Edge and a Node over
// loopback QUIC, prints what to do next, and /admin/v1/nodes shows one ready
// Node. SIGTERM stops it cleanly.
func TestDevCommandServesOneReadyNode(t *testing.T) {
	dev := start(t, "dev", bin.dev, "--http-addr", "127.0.0.1:0")
	base := dev.waitOutput(regexp.MustCompile(`Edge HTTP API\s+(http://\S+)`))
	if !strings.Contains(dev.out.String(), "/admin/v1/nodes") {
		t.Errorf("banner does not say what to try next:\n%s", dev.out)
	}
	// The simulator provider (a real plugin process) comes up with its model.
	n := waitNode(t, base, "dev-node", "ready with the simulator online", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online" &&
			len(n.Providers[0].Targets) == 1 && n.Providers[0].Targets[0] == "sim-small"
	})
	if n.Generation == 0 {
		t.Errorf("ready node without a generation: %+v", n)
	}
	if nodes := adminNodes(t, base); len(nodes) != 1 {
		t.Errorf("dev shows %d nodes, want exactly one: %+v", len(nodes), nodes)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code := httpStatus(t, base+path); code != http.StatusOK {
			t.Errorf("GET %s = %d", path, code)
		}
	}
	dev.stop()
	if !strings.Contains(dev.out.String(), "draining") {
		t.Errorf("the dev node did not drain on SIGTERM:\n%s", dev.out)
	}
}

// managedSetup makes a CA and certificates with `edged tls` and writes
// managed-mode configs for an Edge and one Node, as the README's
// two-machine guide does.
func managedSetup(t *testing.T, nodeID string) (dir, edgeConf, nodeConf, httpBase, healthBase string) {
	t.Helper()
	dir = t.TempDir()
	for _, args := range [][]string{
		{"tls", "ca", "create", "--trust-domain", "iop.test"},
		{"tls", "cert", "create", "--edge", "edge-1", "--ip", "127.0.0.1"},
		{"tls", "cert", "create", "--node", nodeID},
	} {
		if out, err := run(t, dir, bin.edged, args...); err != nil {
			t.Fatalf("edged %v: %v\n%s", args, err, out)
		}
	}
	quicPort, httpPort, healthPort := freePort(t, "udp"), freePort(t, "tcp"), freePort(t, "tcp")
	edgeConf = filepath.Join(dir, "edge.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
edge_id: edge-1
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: mtls, trust_domain: iop.test, ca_file: iop-ca.pem, cert_file: edge-edge-1.pem, key_file: edge-edge-1-key.pem}
`, quicPort, httpPort))
	nodeConf = filepath.Join(dir, "node.yaml")
	writeFile(t, nodeConf, fmt.Sprintf(`
node_id: %s
edge: {address: "127.0.0.1:%d"}
identity: {mode: mtls, trust_domain: iop.test, edge_id: edge-1, ca_file: iop-ca.pem, cert_file: node-%s.pem, key_file: node-%s-key.pem}
lease_key_file: node-lease.key
drain_timeout: 5s
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
`, nodeID, quicPort, nodeID, nodeID))
	return dir, edgeConf, nodeConf, fmt.Sprintf("http://127.0.0.1:%d", httpPort), fmt.Sprintf("http://127.0.0.1:%d", healthPort)
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// S3, R1, R9: separate daemons in managed mode: the Node registers with its
// CA-verified identity and becomes ready; SIGTERM on the Node drains it and
// the Edge fences it with shutdown; a restarted Edge gets every Node back
// with a new generation.
func TestManagedDaemonsRegisterDrainAndSurviveAnEdgeRestart(t *testing.T) {
	dir, edgeConf, nodeConf, base, health := managedSetup(t, "n1")
	edge := start(t, "edged", bin.edged, "run", "--config", edgeConf)
	healthAddr := strings.TrimPrefix(health, "http://")
	node := start(t, "noded", bin.noded, "run", "--config", nodeConf, "--health-addr", healthAddr)
	_ = node

	n := waitNode(t, base, "n1", "ready", func(n nodeView) bool { return n.State == "ready" })
	if n.Identity != "spiffe://iop.test/node/n1" {
		t.Errorf("identity %q, want spiffe://iop.test/node/n1", n.Identity)
	}
	if code := httpStatus(t, health+"/readyz"); code != http.StatusOK {
		t.Errorf("node /readyz = %d while ready", code)
	}
	if _, err := os.Stat(filepath.Join(dir, "node-lease.key")); err != nil {
		t.Errorf("lease key file not created: %v", err)
	}

	// Edge restart: the Node comes back by itself with a new generation.
	edge.stop()
	if code := httpStatus(t, health+"/readyz"); code == http.StatusOK {
		// It may take a moment to notice; it must not stay ready.
		waitFor(t, "node notices the edge is gone", func() bool { return httpStatus(t, health+"/readyz") != http.StatusOK })
	}
	start(t, "edged (restarted)", bin.edged, "run", "--config", edgeConf)
	again := waitNode(t, base, "n1", "ready again", func(v nodeView) bool { return v.State == "ready" })
	if again.Generation <= n.Generation {
		t.Errorf("generation after the edge restart %d, want above %d", again.Generation, n.Generation)
	}

	// Drain: SIGTERM on the Node; the Edge sees it leave with shutdown.
	node.stop()
	if !strings.Contains(node.out.String(), "draining") {
		t.Errorf("node did not drain:\n%s", node.out)
	}
	waitNode(t, base, "n1", "fenced with shutdown", func(v nodeView) bool { return v.State == "fenced" && v.FenceReason == "shutdown" })
}

// A Node whose certificate names another node is refused before it
// registers, with a clear error on both sides (S3).
func TestManagedNodeWithAnotherNodesCertificateIsRefused(t *testing.T) {
	dir, edgeConf, _, base, _ := managedSetup(t, "n1")
	edge := start(t, "edged", bin.edged, "run", "--config", edgeConf)
	quic := regexp.MustCompile(`quic: "(127\.0\.0\.1:\d+)"`).FindStringSubmatch(readFile(t, edgeConf))[1]
	// The impostor claims to be n2 with n1's certificate.
	impostor := filepath.Join(dir, "impostor.yaml")
	writeFile(t, impostor, fmt.Sprintf(`
node_id: n2
edge: {address: "%s"}
identity: {mode: mtls, trust_domain: iop.test, ca_file: iop-ca.pem, cert_file: node-n1.pem, key_file: node-n1-key.pem}
reconnect: {initial_backoff: 50ms, max_backoff: 200ms}
`, quic))
	out, err := run(t, dir, bin.noded, "run", "--config", impostor)
	if err == nil || !strings.Contains(out, "names spiffe://iop.test/node/n1, but this node is spiffe://iop.test/node/n2") {
		t.Errorf("noded with another node's certificate: err=%v\n%s", err, out)
	}
	if nodes := adminNodes(t, base); len(nodes) != 0 {
		t.Errorf("impostor registered: %+v", nodes)
	}
	_ = edge
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Bad configuration is rejected with the field path and the reason, and
// nothing starts.
func TestBadConfigIsRejectedWithItsFieldPath(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "edge.yaml")
	writeFile(t, bad, "listen:\n  quic: 127.0.0.1:7443\nidentity:\n  mode: plaintext\n")
	out, err := run(t, dir, bin.edged, "config", "check", bad)
	if err == nil || !strings.Contains(out, "identity.mode (line 4)") {
		t.Errorf("edged config check on a bad mode: err=%v\n%s", err, out)
	}
	out, err = run(t, dir, bin.edged, "run", "--config", bad)
	if err == nil || !strings.Contains(out, "identity.mode") {
		t.Errorf("edged run with a bad config: err=%v\n%s", err, out)
	}
	badNode := filepath.Join(dir, "node.yaml")
	writeFile(t, badNode, "node_id: n1\nedge: {address: 127.0.0.1:7443}\nidentity: {mode: loopback}\nproviders:\n  - name: p\n    adapter: ollama\n    capcity: 2\n")
	out, err = run(t, dir, bin.noded, "run", "--config", badNode)
	if err == nil || !strings.Contains(out, "providers[0].capcity") || !strings.Contains(out, `did you mean "capacity"`) {
		t.Errorf("noded run with a misspelt field: err=%v\n%s", err, out)
	}
}
