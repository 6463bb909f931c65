package integration

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// enrollEdge is an Edge set up as the README's two-machine guide says: a CA
// from `edged tls ca create` and enrollment on (the CA key and a data_dir),
// so that Nodes join with `edged node add` and `noded join`. Its own
// certificate is one it issues itself, or with certFiles one from `edged
// tls cert create`.
type enrollEdge struct {
	t          *testing.T
	dir, conf  string
	base, quic string
	args       []string
	proc       *proc
	starts     int
}

func enrollSetup(t *testing.T, certFiles bool, args ...string) *enrollEdge {
	t.Helper()
	dir := t.TempDir()
	cmds := [][]string{{"tls", "ca", "create", "--trust-domain", "iop.test"}}
	identity := "{mode: mtls, trust_domain: iop.test, ca_file: iop-ca.pem}"
	if certFiles {
		cmds = append(cmds, []string{"tls", "cert", "create", "--edge", "edge-1"})
		identity = "{mode: mtls, trust_domain: iop.test, ca_file: iop-ca.pem, cert_file: edge-edge-1.pem, key_file: edge-edge-1-key.pem}"
	}
	for _, a := range cmds {
		if out, err := run(t, dir, bin.edged, a...); err != nil {
			t.Fatalf("edged %v: %v\n%s", a, err, out)
		}
	}
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	e := &enrollEdge{t: t, dir: dir, conf: filepath.Join(dir, "edge.yaml"), args: args,
		base: fmt.Sprintf("http://127.0.0.1:%d", httpPort), quic: fmt.Sprintf("127.0.0.1:%d", quicPort)}
	writeFile(t, e.conf, fmt.Sprintf(`
edge_id: edge-1
listen: {quic: %q, http: "127.0.0.1:%d"}
identity: %s
data_dir: data
enrollment: {ca_key_file: iop-ca-key.pem}
`, e.quic, httpPort, identity))
	return e
}

// start runs the Edge and waits until it serves.
func (e *enrollEdge) start() {
	e.t.Helper()
	e.starts++
	e.proc = start(e.t, fmt.Sprintf("edged (start %d)", e.starts), bin.edged, append([]string{"run", "--config", e.conf}, e.args...)...)
	e.proc.waitOutput(regexp.MustCompile(`serving http`))
}

// add runs `edged node add` and returns the join command's address and
// token, and what it printed.
func (e *enrollEdge) add(id string, extra ...string) (addr, token, out string) {
	e.t.Helper()
	out, err := run(e.t, e.dir, bin.edged, append([]string{"node", "add", id, "--config", e.conf}, extra...)...)
	if err != nil {
		e.t.Fatalf("edged node add %s: %v\n%s", id, err, out)
	}
	m := regexp.MustCompile(`noded join (\S+) --token (\S+) --start`).FindStringSubmatch(out)
	if m == nil {
		e.t.Fatalf("edged node add printed no join command:\n%s", out)
	}
	return m[1], m[2], out
}

// list runs `edged node list --json`.
func (e *enrollEdge) list() []listedNode {
	e.t.Helper()
	out, err := run(e.t, e.dir, bin.edged, "node", "list", "--json", "--config", e.conf)
	if err != nil {
		e.t.Fatalf("edged node list: %v\n%s", err, out)
	}
	var nodes []listedNode
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		e.t.Fatalf("edged node list --json: %v\n%s", err, out)
	}
	return nodes
}

type listedNode struct {
	ID           string
	Identity     string
	Removed      time.Time
	LastSeen     time.Time `json:"last_seen"`
	Connected    string
	Certificates []struct {
		Serial   string
		NotAfter time.Time `json:"not_after"`
		Via      string
		Revoked  time.Time
	}
}

// joinArgs are `noded join`'s arguments for a Node served by fake.
func joinArgs(addr, token, dir string, fake *fakeollama.Server) []string {
	return []string{"join", addr, "--token", token, "--dir", dir, "--ollama-url", fake.URL()}
}

// certSerial reads the serial of the certificate in file, as the Edge
// spells it.
func certSerial(t *testing.T, file string) (serial string, cert *x509.Certificate) {
	t.Helper()
	block, _ := pem.Decode([]byte(readFile(t, file)))
	if block == nil {
		t.Fatalf("%s: no PEM", file)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.SerialNumber.Text(16), c
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// P5, S3: `edged node add` → `noded join --start` → the Node registered
// with its SPIFFE identity, its key made on the Node and kept 0600. The
// token works once; an expired token and a token of another Edge are
// refused with a clear message, and nothing is issued for them.
func TestNodeJoinsWithOneTokenOnceAndBadTokensAreRefused(t *testing.T) {
	fake := fakeollama.New(fakeollama.Model{Name: "tiny:latest", Text: "hello"})
	t.Cleanup(fake.Close)
	e := enrollSetup(t, true)
	e.start()
	addr, token, out := e.add("n1")
	if addr != e.quic || !strings.Contains(out, "sha256:") {
		t.Errorf("node add printed address %s (want %s), and should name the CA hash:\n%s", addr, e.quic, out)
	}

	nodeDir := filepath.Join(t.TempDir(), "node")
	node := start(t, "noded join", bin.noded, append(joinArgs(addr, token, nodeDir, fake), "--start")...)
	n := waitNode(t, e.base, "n1", "ready with ollama online", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
	})
	if n.Identity != "spiffe://iop.test/node/n1" {
		t.Errorf("identity %q, want spiffe://iop.test/node/n1", n.Identity)
	}
	node.waitOutput(regexp.MustCompile(`Joined Edge edge-1 as spiffe://iop.test/node/n1`))
	if m := mode(t, nodeDir); m != 0o700 {
		t.Errorf("node dir mode %v, want 0700", m)
	}
	for _, f := range []string{"node-key.pem", "node.yaml", "lease.key"} {
		if m := mode(t, filepath.Join(nodeDir, f)); m != 0o600 {
			t.Errorf("%s mode %v, want 0600", f, m)
		}
	}
	serial, _ := certSerial(t, filepath.Join(nodeDir, "node.pem"))

	// The same token again: refused, nothing written, nothing issued.
	again := filepath.Join(t.TempDir(), "again")
	out, err := run(t, "", bin.noded, joinArgs(addr, token, again, fake)...)
	if err == nil || !strings.Contains(out, "this token was already used") {
		t.Errorf("second use of the token: err=%v\n%s", err, out)
	}
	if _, err := os.Stat(again); !os.IsNotExist(err) {
		t.Errorf("a refused join wrote %s: %v", again, err)
	}

	// An expired token.
	_, short, out := e.add("n2", "--ttl", "1s")
	until, perr := time.Parse(time.RFC3339, regexp.MustCompile(`valid until (\S+)`).FindStringSubmatch(out)[1])
	if perr != nil {
		t.Fatal(perr)
	}
	time.Sleep(time.Until(until.Add(1100 * time.Millisecond))) // the printed time is cut to the second
	out, err = run(t, "", bin.noded, joinArgs(addr, short, filepath.Join(t.TempDir(), "n2"), fake)...)
	if err == nil || !strings.Contains(out, "this token has expired") || !strings.Contains(out, "edged node add n2") {
		t.Errorf("expired token: err=%v\n%s", err, out)
	}

	// A token of another Edge (another CA), made while that Edge is not
	// running: this Edge's CA does not match it, and the secret never
	// leaves the Node.
	other := enrollSetup(t, false)
	_, foreign, _ := other.add("n3")
	out, err = run(t, "", bin.noded, joinArgs(addr, foreign, filepath.Join(t.TempDir(), "n3"), fake)...)
	if err == nil || !strings.Contains(out, "the token is for another Edge") {
		t.Errorf("foreign token: err=%v\n%s", err, out)
	}
	if strings.Contains(e.proc.out.String(), "node=n3") {
		t.Errorf("the Edge heard of the foreign token:\n%s", e.proc.out)
	}

	// Malformed: said so before anything is sent.
	out, err = run(t, "", bin.noded, joinArgs(addr, "iop1.nope", filepath.Join(t.TempDir(), "n4"), fake)...)
	if err == nil || !strings.Contains(out, "malformed join token") {
		t.Errorf("malformed token: err=%v\n%s", err, out)
	}

	// One Node, one certificate: the refusals issued nothing.
	var listed []listedNode
	for _, l := range e.list() {
		if len(l.Certificates) > 0 {
			listed = append(listed, l)
		}
	}
	if len(listed) != 1 || listed[0].ID != "n1" || len(listed[0].Certificates) != 1 || listed[0].Certificates[0].Serial != serial ||
		listed[0].Connected != "ready" || listed[0].LastSeen.IsZero() {
		t.Errorf("node list: %+v, want n1 alone, ready, seen, with certificate %s", listed, serial)
	}
}

// P5: a certificate renews over the Node's connection with no run
// interrupted (same generation, the run's whole answer); the Edge
// restarted between `node add` and `noded join` takes the token once, and
// restarted between issue and renewal keeps the Node's identity and
// renews it again.
func TestCertificatesRenewWithoutInterruptionAndAcrossEdgeRestarts(t *testing.T) {
	const lifetime = 12 * time.Second // renewal at 8 s
	words := strings.TrimSpace(strings.Repeat("tok ", 30))
	fake := fakeollama.New(fakeollama.Model{Name: "slow:latest", Text: words, TokenDelay: 100 * time.Millisecond})
	t.Cleanup(fake.Close)
	e := enrollSetup(t, false, "--test-node-cert-lifetime", lifetime.String())
	e.start()
	addr, token, _ := e.add("n1")
	e.proc.stop()
	e.start() // the token outlives the Edge process

	nodeDir := filepath.Join(t.TempDir(), "node")
	node := start(t, "noded join", bin.noded, append(joinArgs(addr, token, nodeDir, fake), "--start")...)
	first := waitNode(t, e.base, "n1", "ready with ollama online", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
	})
	certFile := filepath.Join(nodeDir, "node.pem")
	serial0, cert0 := certSerial(t, certFile)
	if got := cert0.NotAfter.Sub(cert0.NotBefore); got < lifetime || got > lifetime+2*time.Second {
		t.Errorf("certificate lifetime %s, want %s", got, lifetime)
	}

	// A 3 s streamed run that spans a renewal: it starts a second before
	// one is due (the next one, if a slow start left less than that).
	due := func(c *x509.Certificate) time.Time { return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3) }
	if time.Until(due(cert0)) < 1500*time.Millisecond {
		waitFor(t, "the first renewal", func() bool { s, _ := certSerial(t, certFile); return s != serial0 })
		serial0, cert0 = certSerial(t, certFile)
	}
	time.Sleep(time.Until(due(cert0).Add(-time.Second)))
	if s, _ := certSerial(t, certFile); s != serial0 {
		t.Fatalf("renewed before it was due (%s)", due(cert0))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	text, err := streamChat(ctx, e.base, "slow")
	if err != nil || text != words {
		t.Fatalf("the run across the renewal: err=%v, text %q", err, text)
	}
	serial1, _ := certSerial(t, certFile)
	if serial1 == serial0 {
		t.Fatalf("no renewal during the run (due %s)", due(cert0))
	}
	if n := waitNode(t, e.base, "n1", "ready", func(n nodeView) bool { return n.State == "ready" }); n.Generation != first.Generation {
		t.Errorf("generation %d after the renewal, want %d: the connection was replaced", n.Generation, first.Generation)
	}
	node.waitOutput(regexp.MustCompile(`certificate renewed`))

	// The Edge restarts: the Node comes back with its renewed identity,
	// which the new Edge process renews in turn.
	e.proc.stop()
	e.start()
	again := waitNode(t, e.base, "n1", "ready again", func(n nodeView) bool { return n.State == "ready" && n.Generation > first.Generation })
	if again.Identity != "spiffe://iop.test/node/n1" {
		t.Errorf("identity after restart %q", again.Identity)
	}
	waitFor(t, "a renewal by the restarted Edge", func() bool {
		s, _ := certSerial(t, certFile)
		return s != serial1 && strings.Contains(e.proc.out.String(), "node certificate renewed")
	})
	var renewed int
	for _, l := range e.list() {
		if l.ID == "n1" {
			for _, c := range l.Certificates {
				if c.Via == "renew" {
					renewed++
				}
			}
		}
	}
	if renewed < 2 {
		t.Errorf("the store shows %d renewals, want at least 2", renewed)
	}
}

// P5, S3: `edged node remove` revokes the Node's certificates: the running
// Edge fences its live connection at once, refuses its reconnects, and
// says so in `node list`.
func TestNodeRemoveFencesTheLiveNodeAndRefusesItsReconnect(t *testing.T) {
	fake := fakeollama.New(fakeollama.Model{Name: "tiny:latest", Text: "hello"})
	t.Cleanup(fake.Close)
	e := enrollSetup(t, false)
	e.start()
	addr, token, _ := e.add("n1")
	node := start(t, "noded join", bin.noded, append(joinArgs(addr, token, filepath.Join(t.TempDir(), "node"), fake), "--start")...)
	first := waitNode(t, e.base, "n1", "ready", func(n nodeView) bool { return n.State == "ready" })

	out, err := run(t, e.dir, bin.edged, "node", "remove", "n1", "--config", e.conf)
	if err != nil || !strings.Contains(out, "revoked 1 certificate(s)") || !strings.Contains(out, "connection was closed") {
		t.Fatalf("edged node remove: err=%v\n%s", err, out)
	}
	n := waitNode(t, e.base, "n1", "fenced as unauthenticated", func(n nodeView) bool {
		return n.State == "fenced" && n.FenceReason == "unauthenticated"
	})
	if n.Generation != first.Generation {
		t.Errorf("fenced generation %d, want %d", n.Generation, first.Generation)
	}
	// The Node redials and is refused, every time.
	node.waitOutput(regexp.MustCompile(`edge refused registration \(unauthenticated\): node n1 was removed`))
	if v := waitNode(t, e.base, "n1", "still fenced", func(nodeView) bool { return true }); v.State != "fenced" || v.Generation != first.Generation {
		t.Errorf("after the refused reconnect: %+v", v)
	}
	l := e.list()
	if len(l) != 1 || l[0].Removed.IsZero() || len(l[0].Certificates) != 1 || l[0].Certificates[0].Revoked.IsZero() {
		t.Errorf("node list after remove: %+v", l)
	}
	if out, err := run(t, e.dir, bin.edged, "node", "remove", "nobody", "--config", e.conf); err == nil || !strings.Contains(out, "no such node") {
		t.Errorf("removing an unknown node: err=%v\n%s", err, out)
	}
}
