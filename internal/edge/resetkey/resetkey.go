// Package resetkey gives the Edge a QUIC stateless reset key that stays the
// same across restarts (P4).
//
// When an Edge process dies, its Nodes' connections die with it, but the
// Nodes do not know: without an answer they wait out their heartbeat, up to
// 75 s. A restarted Edge that holds the key its predecessor had answers the
// first packet of such a connection with a stateless reset (RFC 9000 §10.3),
// which the Node can verify, and the Node reconnects at once. The key must
// stay secret: whoever has it can end any connection of this Edge.
//
// Where the key comes from, in order:
//
//  1. data_dir set: the file FileName in it, made (32 random bytes, mode
//     0600, written atomically) at the first start and read at every later
//     one.
//  2. no data_dir, managed (mtls) mode: derived from the Edge's TLS private
//     key with HKDF-SHA256, so an Edge restarted with the same identity has
//     the same key and nothing needs to be stored. A new identity key means
//     a new reset key; Nodes then wait for their heartbeat once.
//  3. neither: a random key of this process (the single-machine loopback
//     setup, whose Node usually lives in the same process anyway).
package resetkey

import (
	"crypto"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/iop-dev/iop/internal/edge/datadir"

	"github.com/quic-go/quic-go"
)

// FileName is the key's file in the data directory.
const FileName = "quic-stateless-reset.key"

// hkdfInfo binds a derived key to its one use.
const hkdfInfo = "iop edge quic stateless reset key v1"

// Source says where a key came from, for the Edge's start-up log.
type Source string

// Sources.
const (
	FromFile     Source = "data_dir"
	FromIdentity Source = "identity_key"
	Ephemeral    Source = "ephemeral"
)

// Load returns the Edge's reset key: from dataDir when it is not empty,
// else derived from identityKey when it is not nil, else random.
func Load(dataDir string, identityKey crypto.PrivateKey) (*quic.StatelessResetKey, Source, error) {
	switch {
	case dataDir != "":
		k, err := fromFile(filepath.Join(dataDir, FileName))
		return k, FromFile, err
	case identityKey != nil:
		k, err := derive(identityKey)
		return k, FromIdentity, err
	}
	var k quic.StatelessResetKey
	_, _ = rand.Read(k[:]) // crypto/rand.Read never fails
	return &k, Ephemeral, nil
}

// derive is HKDF-SHA256 over the PKCS #8 encoding of key.
func derive(key crypto.PrivateKey) (*quic.StatelessResetKey, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("stateless reset key from the identity key: %w", err)
	}
	b, err := hkdf.Key(sha256.New, der, nil, hkdfInfo, len(quic.StatelessResetKey{}))
	if err != nil {
		return nil, fmt.Errorf("stateless reset key from the identity key: %w", err)
	}
	return (*quic.StatelessResetKey)(b), nil
}

// fromFile reads the key at path, or makes it if there is none.
func fromFile(path string) (*quic.StatelessResetKey, error) {
	var k quic.StatelessResetKey
	b, err := os.ReadFile(path)
	switch {
	case err == nil && len(b) == len(k):
		copy(k[:], b)
		return &k, nil
	case err == nil:
		return nil, fmt.Errorf("%s: %d bytes, want %d: not a stateless reset key (remove it to make a new one)", path, len(b), len(k))
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("stateless reset key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	_, _ = rand.Read(k[:])
	if err := datadir.WriteFile(path, k[:]); err != nil {
		return nil, fmt.Errorf("stateless reset key: %w", err)
	}
	return &k, nil
}
