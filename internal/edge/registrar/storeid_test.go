package registrar

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// openTestStore opens the store in dir, or fails t.
func openTestStore(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := OpenStore(dir, time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// idOf is the store id dir's record names.
func idOf(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, StoreIDFile))
	if err != nil {
		t.Fatal(err)
	}
	return parseStoreID(b)
}

// Issue 24, gap 2: a data_dir that had a store and lost it (moved aside,
// deleted, a volume not mounted) is refused, not given an empty store that
// forgets every removal; nothing is made in its place. Removing the
// record, as the error says, starts over on purpose.
func TestAStoreThatWentMissingIsNotMadeAgain(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	if err := s.AddToken(t.Context(), TokenRecord{ID: "t1", NodeID: "gpu-1", Created: time.Now(), Expires: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	record := filepath.Join(dir, StoreIDFile)
	if fi, err := os.Stat(record); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the record: %v %v, want mode 0600", fi, err)
	}
	id := idOf(t, dir)
	if err := os.Rename(filepath.Join(dir, StoreFile), filepath.Join(dir, "aside")); err != nil {
		t.Fatal(err)
	}

	_, err := OpenStore(dir, time.Second, time.Now())
	if !errors.Is(err, ErrStoreMissing) {
		t.Fatalf("OpenStore without the store: %v, want ErrStoreMissing", err)
	}
	for _, want := range []string{filepath.Join(dir, StoreFile), id, "removal", "start over: rm " + record} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, StoreFile)); !os.IsNotExist(err) {
		t.Errorf("a refused open made a store: %v", err)
	}

	// Put back: it opens, tokens and all.
	if err := os.Rename(filepath.Join(dir, "aside"), filepath.Join(dir, StoreFile)); err != nil {
		t.Fatal(err)
	}
	s = openTestStore(t, dir)
	if c, err := s.Contents(t.Context()); err != nil || len(c.Tokens) != 1 {
		t.Errorf("the store put back: %+v %v", c, err)
	}
	s.Close()

	// Gone for good, and started over on purpose.
	if err := os.Remove(filepath.Join(dir, StoreFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(record); err != nil {
		t.Fatal(err)
	}
	s = openTestStore(t, dir)
	defer s.Close()
	if c, err := s.Contents(t.Context()); err != nil || len(c.Tokens) != 0 {
		t.Errorf("the new store: %+v %v, want empty", c, err)
	}
	if got := idOf(t, dir); got == id || got == "" {
		t.Errorf("the new store's id %q, want a new one (the old was %q)", got, id)
	}
}

// Issue 24, gap 2: a store put in place of the one the data_dir had (made
// elsewhere, with tokens of its maker's) is refused and left as it is.
func TestAReplacedStoreIsRefused(t *testing.T) {
	mine, theirs := t.TempDir(), t.TempDir()
	openTestStore(t, mine).Close()
	s := openTestStore(t, theirs)
	if err := s.AddToken(t.Context(), TokenRecord{ID: "evil", NodeID: "gpu-1", Created: time.Now(), Expires: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	planted, err := os.ReadFile(filepath.Join(theirs, StoreFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mine, StoreFile), planted, 0o600); err != nil {
		t.Fatal(err)
	}

	_, err = OpenStore(mine, time.Second, time.Now())
	if !errors.Is(err, ErrStoreReplaced) || !strings.Contains(err.Error(), idOf(t, theirs)) || !strings.Contains(err.Error(), idOf(t, mine)) {
		t.Fatalf("OpenStore of a replaced store: %v, want ErrStoreReplaced naming both ids", err)
	}
	if now, _ := os.ReadFile(filepath.Join(mine, StoreFile)); !bytes.Equal(now, planted) {
		t.Error("the refused store was written to")
	}
}

// A store from before stores had ids is adopted: given one, and recorded.
func TestAStoreWithoutAnIDIsAdoptedWhenNothingIsRecorded(t *testing.T) {
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, StoreFile), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketTokens, bucketCerts, bucketNodes} {
			if _, err := tx.CreateBucket(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	openTestStore(t, dir).Close()
	id := idOf(t, dir)
	if id == "" {
		t.Fatal("no id recorded")
	}
	openTestStore(t, dir).Close()
	if again := idOf(t, dir); again != id {
		t.Errorf("id %s then %s", id, again)
	}
}

func TestARecordWithoutAnIDIsAnError(t *testing.T) {
	dir := t.TempDir()
	openTestStore(t, dir).Close()
	if err := os.WriteFile(filepath.Join(dir, StoreIDFile), []byte("# nothing\nnot-an-id\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenStore(dir, time.Second, time.Now()); err == nil || !strings.Contains(err.Error(), "records no store id") {
		t.Errorf("OpenStore: %v", err)
	}
}
