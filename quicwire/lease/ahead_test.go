package lease

import (
	"bytes"
	"crypto/rand"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"

	"golang.org/x/crypto/nacl/box"
)

// A lease sealed with a key made ahead is byte for byte what
// box.SealAnonymous makes from the same randomness, so a Node opens it
// with box.OpenAnonymous as before (issue 25).
func TestASealingKeySealsAsSealAnonymous(t *testing.T) {
	recipient, priv, err := box.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("a signed lease")
	k, err := newSealingKey(mrand.NewChaCha8([32]byte{1}), recipient)
	if err != nil {
		t.Fatal(err)
	}
	got := k.seal([]byte("head"), msg)
	want, err := box.SealAnonymous([]byte("head"), msg, recipient, mrand.NewChaCha8([32]byte{1}))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("sealed\n%x\nwant\n%x", got, want)
	}
	if plain, ok := box.OpenAnonymous(nil, got[len("head"):], recipient, priv); !ok || !bytes.Equal(plain, msg) {
		t.Fatalf("opened %q, %v", plain, ok)
	}
	if k.shared != [32]byte{} {
		t.Error("the shared key was not wiped after sealing")
	}
}

// countingRand counts the keys made from it (32 bytes each).
type countingRand struct {
	mu    sync.Mutex
	bytes int
}

func (c *countingRand) Read(p []byte) (int, error) {
	c.mu.Lock()
	c.bytes += len(p)
	c.mu.Unlock()
	return rand.Read(p)
}

func (c *countingRand) keys() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes / 32
}

// After the first lease to a recipient, the next ones take keys made
// ahead: a take makes no key on the caller's goroutine, and a goroutine
// of its own tops the recipient's keys up again; no key is used twice.
func TestSealingKeysAreMadeAheadAndUsedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &countingRand{}
		a := &ahead{rand: r, keep: aheadPerRecipient}
		recipient := [32]byte{7}
		seen := map[[32]byte]bool{}
		take := func() {
			k, err := a.take(&recipient)
			if err != nil {
				t.Fatal(err)
			}
			if seen[k.pub] {
				t.Fatalf("ephemeral key %x used twice", k.pub)
			}
			seen[k.pub] = true
		}
		take() // none ready: made inline, and the fill starts
		synctest.Wait()
		if got := r.keys(); got != 1+aheadPerRecipient {
			t.Fatalf("%d keys made after the first lease, want %d", got, 1+aheadPerRecipient)
		}
		for range aheadPerRecipient {
			before := r.keys()
			a.mu.Lock()
			ready := len(a.ready[recipient].keys)
			a.mu.Unlock()
			take()
			if ready == 0 || r.keys() != before {
				t.Fatalf("a take with %d ready made %d keys inline", ready, r.keys()-before)
			}
			synctest.Wait()
		}
		a.mu.Lock()
		ready := len(a.ready[recipient].keys)
		a.mu.Unlock()
		if ready != aheadPerRecipient {
			t.Fatalf("%d keys ready after the fills, want %d", ready, aheadPerRecipient)
		}
	})
}

// Keys are kept for at most aheadRecipients recipients: the least recently
// used one's are wiped and forgotten.
func TestSealingKeysAreKeptForBoundedRecipients(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &ahead{rand: rand.Reader, keep: 1}
		first := [32]byte{0, 0, 0, 1}
		if _, err := a.take(&first); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		a.mu.Lock()
		kept := a.ready[first].keys[0]
		a.mu.Unlock()
		for i := range aheadRecipients {
			id := [32]byte{1, byte(i), byte(i >> 8)}
			if _, err := a.take(&id); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		if len(a.ready) != aheadRecipients {
			t.Fatalf("keys kept for %d recipients, want %d", len(a.ready), aheadRecipients)
		}
		if _, ok := a.ready[first]; ok {
			t.Fatal("the least recently used recipient's keys were kept")
		}
		if kept.shared != [32]byte{} {
			t.Fatal("a dropped key was not wiped")
		}
	})
}
