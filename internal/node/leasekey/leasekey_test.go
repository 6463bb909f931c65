package leasekey_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/node/leasekey"
)

func TestLoadOrCreatePersistsTheKeyPrivately(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lease.key")
	k1, err := leasekey.LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, want 0600", fi.Mode().Perm())
	}
	k2, err := leasekey.LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	if *k1 != *k2 {
		t.Error("reloaded key differs from the created one")
	}
}

func TestLoadOrCreateRejectsAForeignFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lease.key")
	os.WriteFile(path, []byte("not a key"), 0o600)
	if _, err := leasekey.LoadOrCreate(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("err = %v, want an error naming %s", err, path)
	}
}

func TestInMemoryKeysDiffer(t *testing.T) {
	a, _ := leasekey.LoadOrCreate("")
	b, _ := leasekey.LoadOrCreate("")
	if a.Public == b.Public {
		t.Error("two generated keys are equal")
	}
}
