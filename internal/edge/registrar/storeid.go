package registrar

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/iop-dev/iop/internal/edge/datadir"
)

// A data_dir that has had a store must keep it. An empty store in its
// place would forget every removal (a removed Node whose certificate has
// not expired would be let in again) and every pending token, so a store
// that went missing (a volume not mounted, a file deleted or moved aside) is
// an error, not a fresh start. The store has an id, kept in it and, beside
// it, in StoreIDFile, written when the store is made (or first opened by
// an edged that knows of ids). OpenStore refuses a data_dir whose
// StoreIDFile names a store that is not there, or another store than the
// one there. Removing StoreIDFile is how an operator starts over (or keeps a
// store that replaced the old one) on purpose: the error says so.
//
// StoreIDFile is not a lock against whoever can write data_dir: they can
// remove it too. That is what the data_dir check (internal/edge/datadir)
// is for; the record catches the accidents.

// StoreIDFile is the record, in data_dir, of the store the data_dir has.
const StoreIDFile = StoreFile + ".id"

// Errors of OpenStore for a store that is not the one StoreIDFile records.
var (
	ErrStoreMissing  = errors.New("the enrollment store is missing")
	ErrStoreReplaced = errors.New("the enrollment store is not the one this data_dir had")
)

var (
	bucketMeta = []byte("meta")     // the store's own facts
	keyStoreID = []byte("store_id") // in bucketMeta: 32 hex digits
)

const storeIDHeader = "# The enrollment store (" + StoreFile + ") this data_dir has: edged refuses to start\n" +
	"# without it. Remove this file only to start over with an empty store.\n"

// recordedStoreID returns the id StoreIDFile in dir records, "" when there
// is no record; and ErrStoreMissing when it records a store that is not
// there (a link to nothing is not there either).
func recordedStoreID(dir string) (string, error) {
	record, store := filepath.Join(dir, StoreIDFile), filepath.Join(dir, StoreFile)
	b, err := os.ReadFile(record)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("enrollment store: %w", err)
	}
	id := parseStoreID(b)
	if id == "" {
		return "", fmt.Errorf("enrollment store: %s records no store id: restore it, or remove it to keep %s as it is", record, store)
	}
	if _, err := os.Stat(store); errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%w: %s is not there, but this data_dir had it (%s records store %s). It held every join token, issued certificate and Node removal: an empty store would let removed Nodes back in. "+
			"Put it back (restore it from a backup, mount the volume it was on, or point data_dir at where it is). To start over with an empty store on purpose, remove the record of the old one:\n  start over: rm %s",
			ErrStoreMissing, store, record, id, datadir.ShellQuote(record))
	}
	return id, nil
}

// parseStoreID is the id in a StoreIDFile's contents, "" if there is none.
func parseStoreID(b []byte) string {
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) == 32 {
			if _, err := hex.DecodeString(line); err == nil {
				return line
			}
		}
		return ""
	}
	return ""
}

// bindStoreID runs in OpenStore's first transaction: it gives a store that
// has no id a new one, and returns the store's id. When want (the record's)
// is set, a store of another id, or of none, is ErrStoreReplaced.
func bindStoreID(tx *bolt.Tx, dir, want string) (string, error) {
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return "", err
	}
	id := string(meta.Get(keyStoreID))
	if want != "" && id != want {
		has := "store " + id
		if id == "" {
			has = "a store with no id (made elsewhere, or by an older edged)"
		}
		record := filepath.Join(dir, StoreIDFile)
		return "", fmt.Errorf("%w: %s is %s, but %s records store %s: it was replaced. Put the right one back; to keep this one on purpose, remove the record of the old one:\n  start over: rm %s",
			ErrStoreReplaced, filepath.Join(dir, StoreFile), has, record, want, datadir.ShellQuote(record))
	}
	if id == "" {
		var b [16]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
		id = hex.EncodeToString(b[:])
		if err := meta.Put(keyStoreID, []byte(id)); err != nil {
			return "", err
		}
	}
	return id, nil
}

// recordStoreID writes StoreIDFile in dir for id, unless it records id
// already. It runs after the transaction that gave the store its id has
// committed: a crash between the two leaves a store with an id and no
// record, which the next OpenStore records.
func recordStoreID(dir, id, recorded string) error {
	if id == recorded {
		return nil
	}
	if err := datadir.WriteFile(filepath.Join(dir, StoreIDFile), []byte(storeIDHeader+id+"\n")); err != nil {
		return fmt.Errorf("enrollment store: %w", err)
	}
	return nil
}
