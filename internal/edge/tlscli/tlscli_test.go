package tlscli_test

import (
	"bytes"
	"crypto/x509"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alecthomas/kingpin/v2"

	"github.com/iop-dev/iop/internal/edge/tlscli"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/pki"
)

// run parses args into a fresh edged app, as `edged ARGS...` would.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	app := kingpin.New("edged", "test").Terminate(nil).ErrorWriter(io.Discard).UsageWriter(io.Discard)
	tlscli.Register(app, &out)
	_, err := app.Parse(args)
	return out.String(), err
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := run(t, args...)
	if err != nil {
		t.Fatalf("edged %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// newCA runs `tls ca create` into a temp dir and returns the dir and the
// CA flags for `tls cert create`.
func newCA(t *testing.T, trustDomain string) (dir string, caFlags []string) {
	t.Helper()
	dir = t.TempDir()
	mustRun(t, "tls", "ca", "create", "--trust-domain="+trustDomain, "--out-dir="+dir)
	return dir, []string{"--ca=" + filepath.Join(dir, tlscli.CAFile), "--ca-key=" + filepath.Join(dir, tlscli.CAKeyFile)}
}

// TestCertCreateIssuesIdentitiesTheEdgeAndNodeAccept: the files the
// commands write are what managed mode (S3) verifies: a chain to the CA and
// an identity in the CA's trust domain.
func TestCertCreateIssuesIdentitiesTheEdgeAndNodeAccept(t *testing.T) {
	dir, caFlags := newCA(t, "example.test")
	pool, err := pki.LoadPool(filepath.Join(dir, tlscli.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		flag, file string
		want       quicwire.Identity
		usage      x509.ExtKeyUsage
	}{
		{"--node=gpu-1", "node-gpu-1", quicwire.NodeIdentity("example.test", "gpu-1"), x509.ExtKeyUsageClientAuth},
		{"--edge=main", "edge-main", quicwire.EdgeIdentity("example.test", "main"), x509.ExtKeyUsageServerAuth},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			out := mustRun(t, append([]string{"tls", "cert", "create", tt.flag, "--out-dir=" + dir, "--dns=edge.example", "--ip=10.1.2.3", "--days=30"}, caFlags...)...)
			if !strings.Contains(out, tt.want.String()) {
				t.Errorf("output does not name the identity %s:\n%s", tt.want, out)
			}
			kp, err := pki.LoadKeyPair(filepath.Join(dir, tt.file+".pem"), filepath.Join(dir, tt.file+"-key.pem"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := kp.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{tt.usage}}); err != nil {
				t.Errorf("certificate does not chain to the CA: %v", err)
			}
			if got, err := quicwire.IdentityFromCert(kp.Leaf); err != nil || got != tt.want {
				t.Errorf("identity = %v, %v; want %v", got, err, tt.want)
			}
			if len(kp.Leaf.DNSNames) != 1 || len(kp.Leaf.IPAddresses) != 1 {
				t.Errorf("SANs DNS=%v IP=%v, want the requested ones", kp.Leaf.DNSNames, kp.Leaf.IPAddresses)
			}
			if d := kp.Leaf.NotAfter.Sub(kp.Leaf.NotBefore).Hours() / 24; d < 29.9 || d > 30.1 {
				t.Errorf("validity %.1f days, want 30", d)
			}
		})
	}
}

func TestCACreateReportsFilesAndNextStep(t *testing.T) {
	dir := t.TempDir()
	out := mustRun(t, "tls", "ca", "create", "--out-dir="+dir)
	for _, want := range []string{filepath.Join(dir, tlscli.CAFile), filepath.Join(dir, tlscli.CAKeyFile), "iop.local", "edged tls cert create"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	ca, err := pki.LoadCA(filepath.Join(dir, tlscli.CAFile), filepath.Join(dir, tlscli.CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if ca.TrustDomain != "iop.local" {
		t.Errorf("default trust domain %q, want iop.local", ca.TrustDomain)
	}
}

// TestCommandsNeverOverwrite: re-running a command must not replace a CA
// key or a workload's key; the error names the file.
func TestCommandsNeverOverwrite(t *testing.T) {
	dir, caFlags := newCA(t, "iop.local")
	caKey, _ := os.ReadFile(filepath.Join(dir, tlscli.CAKeyFile))
	if _, err := run(t, "tls", "ca", "create", "--out-dir="+dir); err == nil || !strings.Contains(err.Error(), tlscli.CAFile) {
		t.Errorf("second ca create = %v, want a refusal naming %s", err, tlscli.CAFile)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, tlscli.CAKeyFile)); !bytes.Equal(b, caKey) {
		t.Error("CA key was overwritten")
	}

	args := append([]string{"tls", "cert", "create", "--node=n1", "--out-dir=" + dir}, caFlags...)
	mustRun(t, args...)
	nodeKey, _ := os.ReadFile(filepath.Join(dir, "node-n1-key.pem"))
	if _, err := run(t, args...); err == nil || !strings.Contains(err.Error(), "node-n1.pem") {
		t.Errorf("second cert create = %v, want a refusal naming node-n1.pem", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "node-n1-key.pem")); !bytes.Equal(b, nodeKey) {
		t.Error("node key was overwritten")
	}
}

func TestCertCreateRejectsBadRequests(t *testing.T) {
	dir, caFlags := newCA(t, "iop.local")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"id with a slash", []string{"--node=a/b"}, "invalid id"},
		{"dot-dot id", []string{"--edge=.."}, "invalid id"},
		{"both kinds", []string{"--node=n1", "--edge=e1"}, "exactly one"},
		{"no kind", nil, "exactly one"},
		{"zero days", []string{"--node=n1", "--days=0"}, "--days"},
		{"missing CA", []string{"--node=n1", "--ca=" + filepath.Join(dir, "nope.pem"), caFlags[1]}, "nope.pem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"tls", "cert", "create", "--out-dir=" + dir}, tt.args...)
			if !strings.Contains(strings.Join(tt.args, " "), "--ca=") {
				args = append(args, caFlags...)
			}
			_, err := run(t, args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("refused requests left files behind: %v", entries)
	}
}
