package lease

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"

	"golang.org/x/crypto/nacl/box"
	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire/lease/leasepb"
)

// Issuer signs and seals leases with the Edge's key. It is safe for
// concurrent use.
type Issuer struct {
	key ed25519.PrivateKey
	// keys are the ephemeral sealing keys, made ahead by recipient
	// (ahead.go); a test that fixes their randomness has them made inline.
	keys ahead
}

// NewIssuer returns an Issuer that signs with key. It panics if key is not
// an Ed25519 private key: that is a programming error, not a runtime one.
func NewIssuer(key ed25519.PrivateKey) *Issuer {
	if len(key) != ed25519.PrivateKeySize {
		panic(fmt.Sprintf("lease: NewIssuer: private key is %d bytes, want %d", len(key), ed25519.PrivateKeySize))
	}
	return &Issuer{key: key, keys: ahead{rand: rand.Reader, keep: aheadPerRecipient}}
}

// PublicKey is the key Nodes verify leases with; the Edge sends it at
// registration (RegisterResponse.lease_signing_key).
func (i *Issuer) PublicKey() ed25519.PublicKey {
	return i.key.Public().(ed25519.PublicKey)
}

// Issue returns a lease of c and secret, signed and sealed to recipient
// (the Node's X25519 public key from its registration). It refuses claims
// that an Opener would refuse as malformed: see the package doc for the
// required fields and limits. secret is copied, never retained; every
// plaintext buffer Issue makes is wiped before it returns.
func (i *Issuer) Issue(c Claims, secret []byte, recipient *[32]byte) ([]byte, error) {
	if recipient == nil {
		return nil, errors.New("lease: issue: no recipient key")
	}
	pb := toProto(&c, secret)
	if msg := validate(pb); msg != "" {
		return nil, fmt.Errorf("lease: issue %q: %s", c.ID, msg)
	}
	payload, err := proto.Marshal(pb)
	if err != nil { // only invalid UTF-8 in a string field
		return nil, fmt.Errorf("lease: issue %q: %w", c.ID, err)
	}
	defer clear(payload)
	msg := signedMessage(recipient, payload)
	sig := ed25519.Sign(i.key, msg)
	clear(msg)
	signed, err := proto.Marshal(&leasepb.Signed{Payload: payload, Signature: sig})
	if err != nil {
		return nil, fmt.Errorf("lease: issue %q: %w", c.ID, err)
	}
	defer clear(signed)
	if n := headerSize + len(signed) + box.AnonymousOverhead; n > MaxSealedSize {
		return nil, fmt.Errorf("lease: issue %q: sealed lease would be %d bytes, over the limit of %d", c.ID, n, MaxSealedSize)
	}
	out := make([]byte, headerSize, headerSize+len(signed)+box.AnonymousOverhead)
	out[0] = Version
	id := KeyID(recipient)
	copy(out[1:], id[:])
	k, err := i.keys.take(recipient)
	if err != nil {
		return nil, fmt.Errorf("lease: issue %q: seal: %w", c.ID, err)
	}
	return k.seal(out, signed), nil
}
