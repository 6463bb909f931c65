package registrar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// StoreFile is the store's file name in the Edge's data_dir.
const StoreFile = "enroll.db"

// The store is a bbolt file (one file, B+tree, copy-on-write pages, fsync at
// each commit): a transaction is durable when Update returns, and a crash
// mid-write leaves the previous state, never a torn one. Its file lock
// makes it one writer's at a time, which is why `edged node` commands go
// through the running Edge's admin socket (see socket.go) and open the file
// themselves only when no Edge runs. Values are JSON, small and few: one per
// pending or used token, per issued certificate, per node.
var (
	bucketTokens = []byte("tokens") // token id → TokenRecord
	bucketCerts  = []byte("certs")  // serial (hex) → CertRecord
	bucketNodes  = []byte("nodes")  // node id → NodeRecord
)

// keepAfterExpiry is how long a token and a Node's newest certificate stay
// in the store after they end (so `node list` and refusals can still name
// them) before they are pruned (prune.go).
const keepAfterExpiry = 7 * 24 * time.Hour

// TokenRecord is a join token as the Edge keeps it: never the secret, only
// its SHA-256.
type TokenRecord struct {
	ID         string    `json:"id"`
	NodeID     string    `json:"node_id"`
	SecretHash []byte    `json:"secret_sha256"`
	Created    time.Time `json:"created"`
	Expires    time.Time `json:"expires"`
	// Used is when the token was redeemed; zero while pending.
	Used time.Time `json:"used,omitzero"`
}

// CertRecord is a certificate the Edge issued.
type CertRecord struct {
	Serial    string    `json:"serial"` // hex
	NodeID    string    `json:"node_id"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	// Via is how it was issued: "join" or "renew".
	Via string `json:"via"`
	// Issued is when it was issued (NotBefore is backdated, and has
	// seconds only); zero in records older than the field.
	Issued time.Time `json:"issued,omitzero"`
	// Revoked is when `node remove` revoked it; zero while valid.
	Revoked time.Time `json:"revoked,omitzero"`
}

// NodeRecord is what the Edge remembers of a Node beyond its certificates.
type NodeRecord struct {
	ID string `json:"id"`
	// Removed is when `node remove` removed it: every certificate naming
	// it is refused (also ones issued by hand with `edged tls`), and no
	// token is made for it, until `node restore` lifts the removal. Zero
	// while not removed.
	Removed time.Time `json:"removed,omitzero"`
	// RevokedBefore is the time of the last removal lifted by `node
	// restore`: a certificate of the Node that the store has no record of
	// (made by hand, or pruned) and that starts before it is refused, so
	// that lifting a removal lets in only what was made after it. The
	// certificates the Edge issued before are refused by their records,
	// which the removal revoked.
	RevokedBefore time.Time `json:"revoked_before,omitzero"`
	// Restored is when the last removal was lifted.
	Restored time.Time `json:"restored,omitzero"`
	// Issued is when the Edge last issued the Node a certificate (join or
	// renewal): renewals are spaced from it (renewSpacing).
	Issued time.Time `json:"issued,omitzero"`
	// LastSeen is when a connection of the Node was last admitted.
	LastSeen       time.Time `json:"last_seen,omitzero"`
	LastSeenSerial string    `json:"last_seen_serial,omitempty"`
}

// Store is the Edge's durable record of tokens, certificates and removed
// Nodes.
type Store struct {
	db *bolt.DB
}

// ErrStoreLocked is returned by OpenStore when another process (a running
// edged) holds the store.
var ErrStoreLocked = errors.New("the enrollment store is in use by another process (a running edged)")

// OpenStore opens (creating if needed) the store in dir, made mode 0700 if
// missing; the file is mode 0600. A store that dir had and lost, or that
// another replaced, is refused (ErrStoreMissing, ErrStoreReplaced; see
// storeid.go). It waits at most lockWait for another process's lock.
// Tokens and certificates that ended more than keepAfterExpiry before now
// are pruned.
func OpenStore(dir string, lockWait time.Duration, now time.Time) (*Store, error) {
	if dir == "" {
		return nil, errors.New("enrollment store: no data_dir configured")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("enrollment store: %w", err)
	}
	path := filepath.Join(dir, StoreFile)
	recorded, err := recordedStoreID(dir) // storeid.go: a store that went missing is no fresh start
	if err != nil {
		return nil, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockWait})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s", ErrStoreLocked, path)
	}
	if err != nil {
		return nil, fmt.Errorf("enrollment store %s: %w", path, err)
	}
	s := &Store{db: db}
	var id string
	err = db.Update(func(tx *bolt.Tx) (err error) {
		if id, err = bindStoreID(tx, dir, recorded); err != nil {
			return err
		}
		for _, b := range [][]byte{bucketTokens, bucketCerts, bucketNodes} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return prune(tx, now.Add(-keepAfterExpiry))
	})
	if errors.Is(err, ErrStoreReplaced) {
		db.Close()
		return nil, err // it names the store
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("enrollment store %s: %w", path, err)
	}
	if err := recordStoreID(dir, id, recorded); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the store.
func (s *Store) Close() error { return s.db.Close() }

func get[T any](tx *bolt.Tx, bucket []byte, key string) (T, bool, error) {
	var v T
	b := tx.Bucket(bucket).Get([]byte(key))
	if b == nil {
		return v, false, nil
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, false, fmt.Errorf("enrollment store: %s/%s: %w", bucket, key, err)
	}
	return v, true, nil
}

func put(tx *bolt.Tx, bucket []byte, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return tx.Bucket(bucket).Put([]byte(key), b)
}

func all[T any](tx *bolt.Tx, bucket []byte) ([]T, error) {
	var out []T
	err := tx.Bucket(bucket).ForEach(func(k, b []byte) error {
		var v T
		if err := json.Unmarshal(b, &v); err != nil {
			return fmt.Errorf("enrollment store: %s/%s: %w", bucket, k, err)
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

// AddToken records a new pending token, unless its Node is removed: then
// it refuses with ErrNodeRemoved. One transaction with the check, so a
// token racing a removal is either deleted by it or refused.
func (s *Store) AddToken(_ context.Context, t TokenRecord) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketTokens).Get([]byte(t.ID)) != nil {
			return fmt.Errorf("enrollment store: token %s exists", t.ID)
		}
		n, _, err := get[NodeRecord](tx, bucketNodes, t.NodeID)
		if err != nil {
			return err
		}
		if !n.Removed.IsZero() {
			return &removedErr{t.NodeID, n.Removed, fmt.Sprintf("lift the removal with `edged node restore %s` first, then make its token", t.NodeID)}
		}
		return put(tx, bucketTokens, t.ID, t)
	})
}

// Redeem checks token id against secret and now and, in the same
// transaction, calls issue for its node and records the certificate and
// marks the token used. Either all of it is durable when Redeem returns, or
// none of it: a refused or failed join uses no token and issues nothing.
// check refuses a token (unknown, used, expired, wrong secret) with an
// error of its own. A join never lifts a removal (Restore does): the token
// of a removed Node is refused with ErrNodeRemoved. Remove deletes a Node's
// pending tokens and NewToken makes none for a removed Node, so only a
// store changed by hand gets there.
func (s *Store) Redeem(_ context.Context, id string, check func(TokenRecord, bool) error, issue func(nodeID string) (CertRecord, error), now time.Time) (CertRecord, error) {
	var issued CertRecord
	err := s.db.Update(func(tx *bolt.Tx) error {
		t, ok, err := get[TokenRecord](tx, bucketTokens, id)
		if err != nil {
			return err
		}
		if err := check(t, ok); err != nil {
			return err
		}
		n, _, err := get[NodeRecord](tx, bucketNodes, t.NodeID)
		if err != nil {
			return err
		}
		if !n.Removed.IsZero() {
			return removedError(t.NodeID, n.Removed)
		}
		if issued, err = issue(t.NodeID); err != nil {
			return err
		}
		t.Used = now
		if err := put(tx, bucketTokens, id, t); err != nil {
			return err
		}
		if err := put(tx, bucketCerts, issued.Serial, issued); err != nil {
			return err
		}
		n.ID, n.Issued = t.NodeID, now
		return put(tx, bucketNodes, t.NodeID, n)
	})
	return issued, err
}

// Renew decides and records a renewal of nodeID in one transaction: check
// sees the Node's record (a removed Node, one renewed too recently) and
// may refuse; then issue signs, and the certificate is recorded. A
// removal is a transaction too, so a renewal racing one either commits
// first, and the removal revokes the certificate it issued, or sees the
// removal and is refused: no certificate of a removed Node stays
// unrevoked.
func (s *Store) Renew(_ context.Context, nodeID string, check func(NodeRecord) error, issue func() (CertRecord, error), now time.Time) (CertRecord, error) {
	var issued CertRecord
	err := s.db.Update(func(tx *bolt.Tx) error {
		n, _, err := get[NodeRecord](tx, bucketNodes, nodeID)
		if err != nil {
			return err
		}
		if err := check(n); err != nil {
			return err
		}
		if issued, err = issue(); err != nil {
			return err
		}
		if err := put(tx, bucketCerts, issued.Serial, issued); err != nil {
			return err
		}
		n.ID, n.Issued = nodeID, now
		return put(tx, bucketNodes, nodeID, n)
	})
	return issued, err
}

// issuedAt orders a Node's certificates, oldest first: by issue time,
// from NotBefore for records without one (issued before NotBefore+backdate,
// so before any record that has one).
func (c CertRecord) issuedAt() time.Time {
	if c.Issued.IsZero() {
		return c.NotBefore
	}
	return c.Issued
}

// Standing is what the store says of a Node's certificate.
type Standing struct {
	// NodeRemoved: the node was removed at this time (zero: not removed).
	NodeRemoved time.Time
	// CertKnown: the store has a record of this serial (the Edge issued
	// it, and it is not pruned).
	CertKnown bool
	// CertRevoked: this serial was revoked at this time (zero: not revoked,
	// or unknown to the store).
	CertRevoked time.Time
	// RevokedBefore: NodeRecord.RevokedBefore, for a certificate the store
	// does not know.
	RevokedBefore time.Time
}

// Standing reads the standing of nodeID's certificate serial.
func (s *Store) Standing(_ context.Context, nodeID, serial string) (Standing, error) {
	var st Standing
	err := s.db.View(func(tx *bolt.Tx) error {
		n, _, err := get[NodeRecord](tx, bucketNodes, nodeID)
		if err != nil {
			return err
		}
		c, known, err := get[CertRecord](tx, bucketCerts, serial)
		if err != nil {
			return err
		}
		// A record of another Node's serial is not this certificate's.
		known = known && c.NodeID == nodeID
		st = Standing{NodeRemoved: n.Removed, RevokedBefore: n.RevokedBefore}
		if known {
			st.CertKnown, st.CertRevoked = true, c.Revoked
		}
		return nil
	})
	return st, err
}

// Seen records that a connection of nodeID with serial was admitted now.
func (s *Store) Seen(_ context.Context, nodeID, serial string, now time.Time) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		n, _, err := get[NodeRecord](tx, bucketNodes, nodeID)
		if err != nil {
			return err
		}
		n.ID, n.LastSeen, n.LastSeenSerial = nodeID, now, serial
		return put(tx, bucketNodes, nodeID, n)
	})
}

// Remove marks nodeID removed, revokes every certificate issued to it and
// deletes its pending tokens. It reports whether the store knew the node at
// all (a node, a certificate or a token) and which serials it revoked. A
// node it does not know is marked removed only when mark is set (the Edge
// knows it from a connection).
func (s *Store) Remove(_ context.Context, nodeID string, now time.Time, mark bool) (known bool, revoked []string, err error) {
	err = s.db.Update(func(tx *bolt.Tx) error {
		n, ok, err := get[NodeRecord](tx, bucketNodes, nodeID)
		if err != nil {
			return err
		}
		known = ok
		certs, err := all[CertRecord](tx, bucketCerts)
		if err != nil {
			return err
		}
		for _, c := range certs {
			if c.NodeID != nodeID {
				continue
			}
			known = true
			if c.Revoked.IsZero() {
				c.Revoked = now
				revoked = append(revoked, c.Serial)
				if err := put(tx, bucketCerts, c.Serial, c); err != nil {
					return err
				}
			}
		}
		tokens, err := all[TokenRecord](tx, bucketTokens)
		if err != nil {
			return err
		}
		for _, t := range tokens {
			if t.NodeID == nodeID {
				known = true
				if t.Used.IsZero() {
					if err := tx.Bucket(bucketTokens).Delete([]byte(t.ID)); err != nil {
						return err
					}
				}
			}
		}
		if !known && !mark {
			return nil
		}
		n.ID = nodeID
		if n.Removed.IsZero() {
			n.Removed = now
		}
		return put(tx, bucketNodes, nodeID, n)
	})
	return known, revoked, err
}

// Restore lifts the removal of nodeID and returns when it was removed. The
// certificates the removal revoked stay revoked, and a certificate the
// store does not know that starts before the removal is refused
// (RevokedBefore): what lifting lets in is a new join, or a certificate
// made after the removal. ErrUnknownNode if the store does not know the
// Node, ErrNotRemoved if it is not removed.
func (s *Store) Restore(_ context.Context, nodeID string, now time.Time) (removedAt time.Time, err error) {
	err = s.db.Update(func(tx *bolt.Tx) error {
		n, ok, err := get[NodeRecord](tx, bucketNodes, nodeID)
		switch {
		case err != nil:
			return err
		case !ok:
			return fmt.Errorf("%w: %s", ErrUnknownNode, nodeID)
		case n.Removed.IsZero():
			return fmt.Errorf("%w: node %s", ErrNotRemoved, nodeID)
		}
		removedAt = n.Removed
		if n.Removed.After(n.RevokedBefore) {
			n.RevokedBefore = n.Removed
		}
		n.Removed, n.Restored = time.Time{}, now
		return put(tx, bucketNodes, nodeID, n)
	})
	return removedAt, err
}

// Contents is everything in the store, for `edged node list`.
type Contents struct {
	Nodes  []NodeRecord
	Certs  []CertRecord
	Tokens []TokenRecord
}

// Contents reads the whole store.
func (s *Store) Contents(context.Context) (Contents, error) {
	var c Contents
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		if c.Nodes, err = all[NodeRecord](tx, bucketNodes); err != nil {
			return err
		}
		if c.Certs, err = all[CertRecord](tx, bucketCerts); err != nil {
			return err
		}
		c.Tokens, err = all[TokenRecord](tx, bucketTokens)
		return err
	})
	return c, err
}
