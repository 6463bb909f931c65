package lease

import (
	"io"
	"sync"

	"golang.org/x/crypto/blake2b"
	"golang.org/x/crypto/nacl/box"
)

// Sealing keys made ahead (issue 25). box.SealAnonymous spends nearly all
// of its time on two X25519 operations: making the ephemeral key and
// agreeing on the key shared with the recipient. Neither depends on the
// lease, only on the recipient, so the Issuer makes a few ahead for each
// recipient it has sealed to, on a goroutine of their own, and a lease is
// then sealed with the shared key alone: the Edge's part of a request's
// first byte no longer waits on them. The result is byte for byte what
// SealAnonymous makes (the ephemeral public key, then the box under the
// nonce BLAKE2b-192(ephemeral public || recipient)), so Nodes open it as
// before. Each key is used once and wiped once used; the ephemeral private
// key is wiped as soon as the shared key is made.

const (
	// aheadPerRecipient is how many sealing keys are kept ready for one
	// recipient: a burst of that many requests to one Node takes none
	// inline; a larger one makes the rest inline, as before.
	aheadPerRecipient = 4
	// aheadRecipients bounds the recipients keys are kept for; past it
	// the least recently used recipient's keys are wiped.
	aheadRecipients = 1024
)

// sealingKey is one ephemeral key's part of a sealed box to one recipient.
type sealingKey struct {
	pub    [32]byte // the ephemeral public key, the box's first 32 bytes
	nonce  [24]byte
	shared [32]byte // box.Precompute(recipient, ephemeral private)
}

// wipe clears the key shared with the recipient.
func (k *sealingKey) wipe() { clear(k.shared[:]) }

// newSealingKey makes a sealing key for recipient from rand.
func newSealingKey(rand io.Reader, recipient *[32]byte) (*sealingKey, error) {
	pub, priv, err := box.GenerateKey(rand)
	if err != nil {
		return nil, err
	}
	defer clear(priv[:])
	k := &sealingKey{pub: *pub}
	h, err := blake2b.New(24, nil)
	if err != nil {
		return nil, err
	}
	h.Write(pub[:])
	h.Write(recipient[:])
	h.Sum(k.nonce[:0])
	box.Precompute(&k.shared, recipient, priv)
	return k, nil
}

// seal appends to out what box.SealAnonymous(out, msg, recipient) would,
// with k's ephemeral key, and wipes k.
func (k *sealingKey) seal(out, msg []byte) []byte {
	defer k.wipe()
	out = append(out, k.pub[:]...)
	return box.SealAfterPrecomputation(out, msg, &k.nonce, &k.shared)
}

// ahead keeps sealing keys ready by recipient. The zero value keeps none
// (every key is made inline): an Issuer whose randomness is fixed, for
// reproducible output, makes them in order on the caller's goroutine.
type ahead struct {
	rand io.Reader // safe for concurrent use when keep > 0
	keep int

	mu    sync.Mutex
	ready map[[32]byte]*recipientKeys
	tick  uint64 // orders recipientKeys.used
}

// recipientKeys are the keys ready for one recipient.
type recipientKeys struct {
	keys    []*sealingKey
	filling bool   // a fill goroutine runs for this recipient
	used    uint64 // ahead.tick at the last take
}

// take returns a sealing key for recipient: one made ahead when there is
// one, else one made now. Either way it sees that keys are made ahead for
// the next leases to recipient.
func (a *ahead) take(recipient *[32]byte) (*sealingKey, error) {
	if a.keep <= 0 {
		return newSealingKey(a.rand, recipient)
	}
	a.mu.Lock()
	r := a.recipientLocked(*recipient)
	var k *sealingKey
	if n := len(r.keys); n > 0 {
		k, r.keys[n-1] = r.keys[n-1], nil
		r.keys = r.keys[:n-1]
	}
	if !r.filling {
		r.filling = true
		go a.fill(*recipient, r)
	}
	a.mu.Unlock()
	if k != nil {
		return k, nil
	}
	return newSealingKey(a.rand, recipient)
}

// recipientLocked is recipient's entry, made if needed; making one past
// aheadRecipients drops the least recently used one's keys first.
func (a *ahead) recipientLocked(recipient [32]byte) *recipientKeys {
	a.tick++
	if r, ok := a.ready[recipient]; ok {
		r.used = a.tick
		return r
	}
	if a.ready == nil {
		a.ready = make(map[[32]byte]*recipientKeys)
	}
	if len(a.ready) >= aheadRecipients {
		var oldest [32]byte
		var at uint64 = ^uint64(0)
		for id, r := range a.ready {
			if r.used < at {
				oldest, at = id, r.used
			}
		}
		a.dropLocked(oldest)
	}
	r := &recipientKeys{used: a.tick}
	a.ready[recipient] = r
	return r
}

// dropLocked wipes and forgets recipient's keys. A fill running for it
// stops at its next key (it sees its entry is gone).
func (a *ahead) dropLocked(recipient [32]byte) {
	if r, ok := a.ready[recipient]; ok {
		for _, k := range r.keys {
			k.wipe()
		}
		r.keys = nil
		delete(a.ready, recipient)
	}
}

// fill makes keys for recipient until keep are ready, then ends. It stops
// early when the entry was dropped or a key cannot be made (the next take
// makes one inline and reports the error).
func (a *ahead) fill(recipient [32]byte, r *recipientKeys) {
	for {
		a.mu.Lock()
		if a.ready[recipient] != r || len(r.keys) >= a.keep {
			r.filling = false
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		k, err := newSealingKey(a.rand, &recipient)
		a.mu.Lock()
		if err != nil || a.ready[recipient] != r {
			r.filling = false
			a.mu.Unlock()
			if k != nil {
				k.wipe()
			}
			return
		}
		r.keys = append(r.keys, k)
		a.mu.Unlock()
	}
}
