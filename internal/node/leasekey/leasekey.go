// Package leasekey holds the Node's X25519 key pair that the Edge seals
// credential leases to (ARCHITECTURE.md decision 9). The public half is
// sent at registration; the private half never leaves the Node.
package leasekey

import (
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/crypto/curve25519"
	"golang.org/x/crypto/nacl/box"
)

const pemType = "IOP NODE LEASE PRIVATE KEY"

// Key is a Node's lease key pair.
type Key struct {
	Public  [32]byte
	Private [32]byte
}

// Generate returns a new key pair.
func Generate() (*Key, error) {
	pub, priv, err := box.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("lease key: %w", err)
	}
	return &Key{Public: *pub, Private: *priv}, nil
}

// LoadOrCreate reads the key in path, or creates it (mode 0600) if the
// file does not exist. An empty path returns a key that lives in memory
// only: leases sealed to it cannot be opened after a restart, which is
// harmless because leases are short-lived and bound to one connection.
func LoadOrCreate(path string) (*Key, error) {
	if path == "" {
		return Generate()
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		k, err := Generate()
		if err != nil {
			return nil, err
		}
		block := pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: k.Private[:]})
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("lease key: create %s: %w", path, err)
		}
		if _, err := f.Write(block); err != nil {
			f.Close()
			return nil, fmt.Errorf("lease key: write %s: %w", path, err)
		}
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("lease key: write %s: %w", path, err)
		}
		return k, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lease key: %w", err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != pemType || len(block.Bytes) != 32 {
		return nil, fmt.Errorf("lease key: %s is not a PEM %q block of 32 bytes", path, pemType)
	}
	k := &Key{}
	copy(k.Private[:], block.Bytes)
	pub, err := curve25519.X25519(k.Private[:], curve25519.Basepoint)
	if err != nil {
		return nil, fmt.Errorf("lease key: %s: %w", path, err)
	}
	copy(k.Public[:], pub)
	return k, nil
}
