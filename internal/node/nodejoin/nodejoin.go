// Package nodejoin is `noded join`: make the Node's key here, redeem a join
// token at the Edge for a certificate of the Node's identity, and write the
// key, the certificate, the CA and a node.yaml that uses them.
package nodejoin

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/node/nodeconfig"
	"github.com/iop-dev/iop/quicwire/enroll"
	"github.com/iop-dev/iop/quicwire/pki"
)

// File names written in the Node's directory.
const (
	ConfigFile = "node.yaml"
	CertFile   = "node.pem"
	KeyFile    = "node-key.pem"
	CAFile     = "ca.pem"
	LeaseFile  = "lease.key"
)

// DefaultDir is where `noded join` writes unless told otherwise.
const DefaultDir = "iop-node"

// Options are `noded join`'s arguments.
type Options struct {
	// EdgeAddr is the Edge's QUIC address, host:port.
	EdgeAddr string
	// Token is the join token `edged node add` printed.
	Token string
	// Dir is where the files go; made mode 0700.
	Dir string
	// OllamaURL is the Ollama server the written config's provider uses.
	OllamaURL string
	Version   string
	// PacketConn, if set, carries the join's QUIC (tests); else a new UDP
	// socket.
	PacketConn net.PacketConn
}

// Result is what a join wrote.
type Result struct {
	Joined     *enroll.Joined
	ConfigPath string
}

// ErrAlreadyJoined is returned when Dir already holds a joined Node.
var ErrAlreadyJoined = errors.New("already holds a joined Node")

// Join redeems the token and writes the Node's files. Nothing is written
// unless the Edge issued a certificate; the key is made here and written
// only here (mode 0600). Files are written atomically, node.yaml last, so a
// directory with a node.yaml holds a whole identity.
func Join(ctx context.Context, opts Options) (*Result, error) {
	tok, err := enroll.ParseToken(opts.Token)
	if err != nil {
		return nil, fmt.Errorf("--token: %w", err)
	}
	if _, _, err := net.SplitHostPort(opts.EdgeAddr); err != nil {
		return nil, fmt.Errorf("edge address %q: want HOST:PORT (the Edge's listen.quic, UDP 7443 by default)", opts.EdgeAddr)
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, ConfigFile)
	if _, err := os.Stat(cfgPath); err == nil {
		return nil, fmt.Errorf("%s %w (%s): use another --dir, or delete it to join again", dir, ErrAlreadyJoined, ConfigFile)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("make key: %w", err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}

	pc := opts.PacketConn
	if pc == nil {
		udp, err := net.ListenUDP("udp", nil)
		if err != nil {
			return nil, err
		}
		defer udp.Close()
		pc = udp
	}
	tr := &quic.Transport{Conn: pc}
	defer tr.Close()
	joined, err := enroll.Join(ctx, tr, opts.EdgeAddr, tok, csr, opts.Version)
	if err != nil {
		return nil, err
	}

	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	pemOf := func(typ string, der []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}) }
	for _, f := range []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{KeyFile, pemOf("PRIVATE KEY", keyDER), 0o600},
		{CertFile, pemOf("CERTIFICATE", joined.Cert.Raw), 0o644},
		{CAFile, pemOf("CERTIFICATE", joined.CA.Raw), 0o644},
		{ConfigFile, config(joined, opts), 0o600},
	} {
		if err := pki.WriteAtomic(filepath.Join(dir, f.name), f.data, f.perm); err != nil {
			return nil, err
		}
	}
	if _, err := nodeconfig.Load(cfgPath); err != nil {
		return nil, fmt.Errorf("the written configuration does not load (a bug): %w", err)
	}
	return &Result{Joined: joined, ConfigPath: cfgPath}, nil
}

// config is the node.yaml of a joined Node. Paths are relative to it.
func config(j *enroll.Joined, opts Options) []byte {
	url := opts.OllamaURL
	if url == "" {
		url = "http://127.0.0.1:11434"
	}
	return fmt.Appendf(nil, `# Written by noded join at %s. Edit freely: see configs/node-managed.yaml for every field.
node_id: %s

edge:
  address: %s

identity:
  mode: mtls
  trust_domain: %s
  edge_id: %s
  ca_file: %s
  # Renewed over the connection to the Edge before it expires (the key stays).
  cert_file: %s
  key_file: %s

lease_key_file: %s

providers:
  - name: ollama
    adapter: ollama
    config:
      base_url: %s
`, time.Now().UTC().Format(time.RFC3339), j.NodeID, strconv.Quote(opts.EdgeAddr), j.TrustDomain, j.EdgeID,
		CAFile, CertFile, KeyFile, LeaseFile, strconv.Quote(url))
}
