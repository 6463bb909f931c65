package registrar

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
)

// pruneEvery is how often a running Edge prunes its store (keepPruned);
// OpenStore prunes it too, so the offline `edged node` commands see it
// pruned.
const pruneEvery = time.Hour

// What the store keeps. Each record ends: a token when it expires, a
// certificate at its NotAfter (TLS refuses it from then on, revoked or
// not). An ended token, and a Node's newest certificate, stay
// keepAfterExpiry more, for `node list` and refusals to name them. A
// certificate superseded by a newer one of its Node (a renewal's
// predecessor) goes as soon as it ended: renewals would otherwise pile up
// a week of records per Node. Node records stay: they hold removals.
//
// Pruning never lets a certificate in: an ended certificate is refused by
// TLS, and one the store has no record of is refused while its Node is
// removed, and after the removal is lifted if it starts before it
// (NodeRecord.RevokedBefore).

// prune deletes what ended, cutoff being now less keepAfterExpiry (the
// form OpenStore calls it in).
func prune(tx *bolt.Tx, cutoff time.Time) error {
	_, err := pruneAt(tx, cutoff.Add(keepAfterExpiry))
	return err
}

// Prune deletes what ended as of now and returns how many records went.
func (s *Store) Prune(_ context.Context, now time.Time) (int, error) {
	var n int
	err := s.db.Update(func(tx *bolt.Tx) (err error) {
		n, err = pruneAt(tx, now)
		return err
	})
	return n, err
}

// pruneAt deletes the tokens and certificates that ended as of now, as the
// comment above says. A record that does not decode goes too: the store
// wrote it, so it is damage, and keeping it would fail every `node list`.
func pruneAt(tx *bolt.Tx, now time.Time) (int, error) {
	cutoff := now.Add(-keepAfterExpiry)
	var drop [][]byte
	err := tx.Bucket(bucketTokens).ForEach(func(k, v []byte) error {
		var t TokenRecord
		if json.Unmarshal(v, &t) != nil || t.Expires.Before(cutoff) {
			drop = append(drop, slices.Clone(k))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if err := deleteKeys(tx.Bucket(bucketTokens), drop); err != nil {
		return 0, err
	}
	pruned := len(drop)

	// One pass for each Node's newest certificate, one to decide.
	type cert struct {
		key []byte
		rec CertRecord
	}
	var certs []cert
	newest := map[string]time.Time{}
	drop = drop[:0]
	err = tx.Bucket(bucketCerts).ForEach(func(k, v []byte) error {
		var c CertRecord
		if json.Unmarshal(v, &c) != nil {
			drop = append(drop, slices.Clone(k))
			return nil
		}
		certs = append(certs, cert{slices.Clone(k), c})
		if at, ok := newest[c.NodeID]; !ok || c.issuedAt().After(at) {
			newest[c.NodeID] = c.issuedAt()
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, c := range certs {
		superseded := c.rec.issuedAt().Before(newest[c.rec.NodeID])
		if c.rec.NotAfter.Before(cutoff) || (superseded && !c.rec.NotAfter.After(now)) {
			drop = append(drop, c.key)
		}
	}
	if err := deleteKeys(tx.Bucket(bucketCerts), drop); err != nil {
		return 0, err
	}
	return pruned + len(drop), nil
}

func deleteKeys(b *bolt.Bucket, keys [][]byte) error {
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// keepPruned prunes the store every interval until ctx ends. A failure is
// logged and tried again at the next tick: a store that cannot be written
// fails joins and renewals with their own errors.
func (s *Service) keepPruned(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := s.store.Prune(ctx, s.opts.Now())
		switch {
		case err != nil:
			s.log.Error("enrollment store: prune failed", "err", err)
		case n > 0:
			s.log.Info("enrollment store pruned", "records", n)
		}
	}
}
