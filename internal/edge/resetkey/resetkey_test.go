package resetkey

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// P4: an Edge restarted with the same data_dir has the same key, kept in a
// file only its owner can read.
func TestKeyInDataDirSurvivesARestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state") // made on first use
	k1, src, err := Load(dir, nil)
	if err != nil || src != FromFile {
		t.Fatalf("first Load: %v, source %s", err, src)
	}
	fi, err := os.Stat(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, want 0600", fi.Mode().Perm())
	}
	k2, _, err := Load(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if *k1 != *k2 {
		t.Error("the key changed across two loads of the same data_dir")
	}
	// The data_dir wins over an identity key: the key does not change when
	// the Edge's certificate is renewed with a new key.
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	if k3, src, _ := Load(dir, priv); src != FromFile || *k3 != *k1 {
		t.Errorf("with an identity key too: source %s, same key %v", src, *k3 == *k1)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 1 {
		t.Errorf("data_dir holds %d entries, want only the key (no temporary files left)", len(left))
	}
}

func TestCorruptKeyFileIsAnErrorNotANewKey(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err := Load(dir, nil)
	if err == nil || !strings.Contains(err.Error(), "5 bytes, want 32") {
		t.Fatalf("Load of a 5-byte key file: %v", err)
	}
}

// In managed mode without a data_dir the key is derived from the identity
// key: the same identity gives the same key, another identity another key.
func TestKeyDerivedFromTheIdentityKey(t *testing.T) {
	a, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	b, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ka1, src, err := Load("", a)
	if err != nil || src != FromIdentity {
		t.Fatalf("Load: %v, source %s", err, src)
	}
	ka2, _, _ := Load("", a)
	kb, _, _ := Load("", b)
	if *ka1 != *ka2 {
		t.Error("the same identity key gave two reset keys")
	}
	if *ka1 == *kb {
		t.Error("two identity keys gave the same reset key")
	}
	if _, _, err := Load("", struct{}{}); err == nil {
		t.Error("a key that is not a private key was accepted")
	}
}

func TestNoSourceGivesAFreshKeyPerProcess(t *testing.T) {
	k1, src, err := Load("", nil)
	if err != nil || src != Ephemeral {
		t.Fatalf("Load: %v, source %s", err, src)
	}
	k2, _, _ := Load("", nil)
	if *k1 == *k2 {
		t.Error("two ephemeral keys are equal")
	}
}
