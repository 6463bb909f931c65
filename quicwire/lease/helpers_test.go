package lease_test

import (
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/curve25519"
	"golang.org/x/crypto/nacl/box"
	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire/lease"
	"github.com/iop-dev/iop/quicwire/lease/leasepb"
)

// Deterministic keys, so failures reproduce and the fuzz seeds can be
// regenerated. Never use keys like these outside tests.
var (
	edgeKey      = ed25519.NewKeyFromSeed(seed("edge"))
	otherEdgeKey = ed25519.NewKeyFromSeed(seed("another edge"))
	node         = x25519Key("node")
	otherNode    = x25519Key("another node")
)

// t0 is when the test leases are issued (2030-03-17).
var t0 = time.UnixMilli(1_900_000_000_000).UTC()

// testSecret is the credential value of the test leases; no error, log or
// String may ever contain it.
const testSecret = "sk-test-THE-SECRET-must-never-appear"

func seed(name string) []byte {
	s := sha256.Sum256([]byte("iop lease test key: " + name))
	return s[:]
}

type keyPair struct{ priv, pub [32]byte }

func x25519Key(name string) keyPair {
	var k keyPair
	k.priv = [32]byte(seed(name))
	pub, err := curve25519.X25519(k.priv[:], curve25519.Basepoint)
	if err != nil {
		panic(err)
	}
	k.pub = [32]byte(pub)
	return k
}

// clock is a settable clock shared by a test and an Opener.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *clock { return &clock{t: t} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// binding is what the test dispatches with.
func binding() lease.Binding {
	return lease.Binding{
		Principal:  "alice",
		Route:      "chat",
		Slot:       "slot-1",
		Profile:    "default",
		Target:     "llama3:8b",
		Provider:   "openai-1",
		NodeID:     "node-a",
		Generation: 7,
	}
}

// claims returns valid claims for binding(), issued at t0 for a minute.
func claims(id string) lease.Claims {
	return lease.Claims{
		ID:         id,
		Binding:    binding(),
		Credential: "openai-prod",
		Revision:   3,
		IssuedAt:   t0,
		ExpiresAt:  t0.Add(time.Minute),
	}
}

// newOpener returns an Opener for node's key that knows edgeKey, on clk.
func newOpener(clk *clock) *lease.Opener {
	return lease.NewOpener(lease.OpenerConfig{
		Key:     &node.priv,
		EdgeKey: edgeKey.Public().(ed25519.PublicKey),
		Now:     clk.Now,
	})
}

// issue issues c with testSecret to node.
func issue(t testing.TB, c lease.Claims) []byte {
	t.Helper()
	sealed, err := lease.NewIssuer(edgeKey).Issue(c, []byte(testSecret), &node.pub)
	if err != nil {
		t.Fatalf("Issue: %v", err)
	}
	return sealed
}

// wantRejected fails unless err is a *RejectedError of reason that does
// not show the secret.
func wantRejected(t testing.TB, err error, reason lease.Reason) {
	t.Helper()
	if err == nil {
		t.Fatalf("opened, want refused as %s", reason)
	}
	if !errors.Is(err, lease.ErrRejected) {
		t.Fatalf("error %v is not ErrRejected", err)
	}
	got, ok := lease.ReasonOf(err)
	if !ok || got != reason {
		t.Fatalf("error %q: reason %q, want %q", err, got, reason)
	}
	if strings.Contains(err.Error(), testSecret) {
		t.Fatalf("error shows the secret: %q", err)
	}
}

// The format by hand, from the package doc, independent of the package's
// own code: tests build leases the Issuer never would with these.

func signedMessage(recipient *[32]byte, payload []byte) []byte {
	return append(append([]byte("iop-lease-v1\x00"), recipient[:]...), payload...)
}

// signRaw signs the marshalled pb with key for recipient.
func signRaw(t testing.TB, pb *leasepb.Lease, key ed25519.PrivateKey, recipient *[32]byte) *leasepb.Signed {
	t.Helper()
	payload, err := proto.Marshal(pb)
	if err != nil {
		t.Fatal(err)
	}
	return signPayload(payload, key, recipient)
}

func signPayload(payload []byte, key ed25519.PrivateKey, recipient *[32]byte) *leasepb.Signed {
	return &leasepb.Signed{Payload: payload, Signature: ed25519.Sign(key, signedMessage(recipient, payload))}
}

// sealRaw seals s to recipient.
func sealRaw(t testing.TB, s *leasepb.Signed, recipient *[32]byte) []byte {
	t.Helper()
	b, err := proto.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return sealBytes(t, b, recipient)
}

// sealBytes seals arbitrary content to recipient, header included.
func sealBytes(t testing.TB, content []byte, recipient *[32]byte) []byte {
	t.Helper()
	id := sha256.Sum256(recipient[:])
	out := append([]byte{1}, id[:8]...)
	out, err := box.SealAnonymous(out, content, recipient, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// validProto is claims("raw") as a leasepb.Lease.
func validProto() *leasepb.Lease {
	c := claims("raw")
	return lease.ToProto(&c, []byte(testSecret))
}
