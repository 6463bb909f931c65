package lease

import (
	"crypto/sha256"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/crypto/nacl/box"

	"github.com/iop-dev/iop/quicwire/lease/leasepb"
)

// Format constants. See the package doc.
const (
	// Version is the first byte of a sealed lease.
	Version byte = 1
	// KeyIDSize is the length of the recipient key id after the version.
	KeyIDSize = 8
	// MaxSealedSize bounds a whole sealed lease, header included.
	MaxSealedSize = 16 << 10
	// MaxSecretSize bounds the credential value.
	MaxSecretSize = 8 << 10
	// MaxIDSize bounds a lease id, which the replay cache keeps.
	MaxIDSize = 128
	// MaxLifetime bounds expires - issued, and so how long the replay cache
	// keeps an id.
	MaxLifetime = time.Hour
)

// signatureDomain starts every signed message, so an Ed25519 signature of
// the Edge's key over anything else can never pass for a lease signature.
const signatureDomain = "iop-lease-v1\x00"

const (
	headerSize    = 1 + KeyIDSize
	minSealedSize = headerSize + box.AnonymousOverhead
)

// Binding is what a lease is bound to (R11): the dispatch it was issued
// for. The Node builds it from the request it is serving, its own node id
// and the generation of the connection the request came on.
type Binding struct {
	Principal string
	Route     string
	Slot      string
	Profile   string
	Target    string
	Provider  string
	NodeID    string
	// Generation of the Node's connection the lease was dispatched on.
	Generation uint64
}

// Claims is everything a lease says except the secret.
type Claims struct {
	// ID is unique per issued lease: the replay cache is keyed by it.
	ID string
	Binding
	// Credential names the credential (never its value).
	Credential string
	// Revision of the credential; see Opener.Apply for revocation.
	Revision uint64
	// IssuedAt and ExpiresAt travel as Unix milliseconds.
	IssuedAt, ExpiresAt time.Time
}

// Lease is an opened lease: its claims and the credential's value. Its
// String, Format and LogValue never show the secret.
type Lease struct {
	Claims
	Secret []byte
}

// Wipe zeroes the secret and drops it. Call it as soon as the provider
// call holds the value.
func (l *Lease) Wipe() {
	clear(l.Secret)
	l.Secret = nil
}

// String describes the lease without its secret.
func (l Lease) String() string {
	return fmt.Sprintf("lease %q (credential %q revision %d, node %q generation %d, provider %q target %q, expires %s, secret redacted)",
		l.ID, l.Credential, l.Revision, l.NodeID, l.Generation, l.Provider, l.Target, l.ExpiresAt.UTC().Format(time.RFC3339Nano))
}

// Format prints String for every verb, so no verb (%d, %x, %#v...) can
// reach the secret.
func (l Lease) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(l.String())) }

// LogValue logs the claims without the secret.
func (l Lease) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("id", l.ID),
		slog.String("credential", l.Credential),
		slog.Uint64("revision", l.Revision),
		slog.String("node_id", l.NodeID),
		slog.Uint64("generation", l.Generation),
		slog.String("provider", l.Provider),
		slog.String("target", l.Target),
		slog.Time("expires_at", l.ExpiresAt),
	)
}

// KeyID is the id of an X25519 public key in a sealed lease's header: the
// first KeyIDSize bytes of its SHA-256.
func KeyID(pub *[32]byte) [KeyIDSize]byte {
	sum := sha256.Sum256(pub[:])
	return [KeyIDSize]byte(sum[:KeyIDSize])
}

// signedMessage is what the Edge signs: the domain, the recipient's public
// key and the payload.
func signedMessage(recipient *[32]byte, payload []byte) []byte {
	m := make([]byte, 0, len(signatureDomain)+len(recipient)+len(payload))
	m = append(m, signatureDomain...)
	m = append(m, recipient[:]...)
	return append(m, payload...)
}

func toProto(c *Claims, secret []byte) *leasepb.Lease {
	return &leasepb.Lease{
		LeaseId:            c.ID,
		Principal:          c.Principal,
		Route:              c.Route,
		Slot:               c.Slot,
		Profile:            c.Profile,
		Target:             c.Target,
		Provider:           c.Provider,
		NodeId:             c.NodeID,
		Credential:         c.Credential,
		CredentialRevision: c.Revision,
		Generation:         c.Generation,
		IssuedUnixMs:       c.IssuedAt.UnixMilli(),
		ExpiresUnixMs:      c.ExpiresAt.UnixMilli(),
		Secret:             secret,
	}
}

func fromProto(pb *leasepb.Lease) *Lease {
	return &Lease{
		Claims: Claims{
			ID: pb.GetLeaseId(),
			Binding: Binding{
				Principal:  pb.GetPrincipal(),
				Route:      pb.GetRoute(),
				Slot:       pb.GetSlot(),
				Profile:    pb.GetProfile(),
				Target:     pb.GetTarget(),
				Provider:   pb.GetProvider(),
				NodeID:     pb.GetNodeId(),
				Generation: pb.GetGeneration(),
			},
			Credential: pb.GetCredential(),
			Revision:   pb.GetCredentialRevision(),
			IssuedAt:   time.UnixMilli(pb.GetIssuedUnixMs()),
			ExpiresAt:  time.UnixMilli(pb.GetExpiresUnixMs()),
		},
		Secret: pb.GetSecret(),
	}
}

// validate checks the fields every lease must have, on both sides: the
// Issuer refuses to make a lease the Opener would refuse as malformed. It
// returns "" or what is wrong (never a value of the secret).
func validate(pb *leasepb.Lease) string {
	switch {
	case pb.GetLeaseId() == "":
		return "lease_id is empty"
	case len(pb.GetLeaseId()) > MaxIDSize:
		return fmt.Sprintf("lease_id is %d bytes, over the limit of %d", len(pb.GetLeaseId()), MaxIDSize)
	case pb.GetNodeId() == "":
		return "node_id is empty"
	case pb.GetProvider() == "":
		return "provider is empty"
	case pb.GetCredential() == "":
		return "credential is empty"
	case pb.GetGeneration() == 0:
		return "generation is 0"
	case pb.GetIssuedUnixMs() <= 0:
		return "issued_unix_ms is not set"
	case pb.GetExpiresUnixMs() <= pb.GetIssuedUnixMs():
		return "expires_unix_ms is not after issued_unix_ms"
	case pb.GetExpiresUnixMs()-pb.GetIssuedUnixMs() > MaxLifetime.Milliseconds():
		return fmt.Sprintf("lifetime of %s is over the limit of %s",
			time.Duration(pb.GetExpiresUnixMs()-pb.GetIssuedUnixMs())*time.Millisecond, MaxLifetime)
	case len(pb.GetSecret()) == 0:
		return "secret is empty"
	case len(pb.GetSecret()) > MaxSecretSize:
		return fmt.Sprintf("secret is %d bytes, over the limit of %d", len(pb.GetSecret()), MaxSecretSize)
	}
	return ""
}
