package credentials_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"golang.org/x/crypto/nacl/box"

	"github.com/iop-dev/iop/internal/edge/credentials"
	"github.com/iop-dev/iop/quicwire/lease"
)

// node is a lease.Opener with an Issuer that seals to it: the two ends of a lease.
type node struct {
	issuer *lease.Issuer
	opener *lease.Opener
	pub    *[32]byte
	n      int
}

func newNode(t *testing.T) *node {
	t.Helper()
	pub, priv, err := box.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, edgeKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	iss := lease.NewIssuer(edgeKey)
	return &node{issuer: iss, opener: lease.NewOpener(lease.OpenerConfig{Key: priv, EdgeKey: iss.PublicKey()}), pub: pub}
}

// open issues a lease of g for profile and opens it as the Node would.
func (n *node) open(t *testing.T, profile string, g credentials.Grant) error {
	t.Helper()
	n.n++
	b := lease.Binding{Principal: "alice", Route: "gpt", Slot: "s", Profile: profile, Target: "gpt-4o-mini", Provider: "hosted", NodeID: "gpu-01", Generation: 1}
	now := time.Now()
	sealed, err := n.issuer.Issue(lease.Claims{ID: fmt.Sprintf("lease-%d", n.n), Binding: b, Credential: g.Credential, Revision: g.Revision,
		IssuedAt: now, ExpiresAt: now.Add(time.Minute)}, g.Secret, n.pub)
	if err != nil {
		t.Fatal(err)
	}
	l, err := n.opener.Open(sealed, b)
	if err == nil {
		l.Wipe()
	}
	return err
}

func wantRejected(t *testing.T, what string, err error, want lease.Reason) {
	t.Helper()
	if r, ok := lease.ReasonOf(err); !ok || r != want {
		t.Errorf("%s: Open = %v, want a %s refusal", what, err, want)
	}
}

// SPEC S4 across the hop: a Node that applies Notice refuses the leases the Edge would no
// longer issue, even ones issued before the change.
func TestNoticeMakesTheNodeRefuseWhatTheStoreNoLongerGrants(t *testing.T) {
	s, src := newStore(t)
	n := newNode(t)
	n.opener.Apply(s.Notice())
	old := mustGrant(t, s, "chat")
	if err := n.open(t, "chat", old); err != nil {
		t.Fatalf("a current lease: %v", err)
	}

	// Revoked: a lease of the old revision, issued before the revoke, dies on the Node.
	if _, err := s.Revoke("upstream"); err != nil {
		t.Fatal(err)
	}
	n.opener.Apply(s.Notice())
	wantRejected(t, "old revision after a revoke", n.open(t, "chat", old), lease.Revoked)

	// Reloaded: the new revision opens.
	src.setEnv("OPENAI_API_KEY", rotatedSecret)
	if _, err := s.Reload("upstream"); err != nil {
		t.Fatal(err)
	}
	n.opener.Apply(s.Notice())
	current := mustGrant(t, s, "chat")
	if err := n.open(t, "chat", current); err != nil {
		t.Errorf("the reloaded credential: %v", err)
	}

	// Disabled profile, then disabled credential: refused on the Node too.
	if err := s.DisableProfile("chat"); err != nil {
		t.Fatal(err)
	}
	n.opener.Apply(s.Notice())
	wantRejected(t, "disabled profile", n.open(t, "chat", current), lease.Disabled)
	if err := n.open(t, "code", current); err != nil {
		t.Errorf("another profile of the credential: %v", err)
	}
	_ = s.EnableProfile("chat")
	_ = s.DisableCredential("upstream")
	n.opener.Apply(s.Notice())
	wantRejected(t, "disabled credential", n.open(t, "code", current), lease.Disabled)
	_ = s.EnableCredential("upstream")
	n.opener.Apply(s.Notice())
	if err := n.open(t, "chat", current); err != nil {
		t.Errorf("enabled again: %v", err)
	}
}
