package lease

import (
	"bytes"
	"crypto/ed25519"
	"crypto/subtle"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/curve25519"
	"golang.org/x/crypto/nacl/box"
	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire/lease/leasepb"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// DefaultSkew is the clock skew an Opener tolerates between the Edge and
// the Node when OpenerConfig.Skew is zero: a lease opens until 5 s after
// its expiry, and from 5 s before its issue time.
const DefaultSkew = 5 * time.Second

// DefaultMaxReplay is the replay cache's bound when OpenerConfig.MaxReplay
// is zero. Ids stay at most MaxLifetime plus the skew, so this allows a
// sustained 18 leases a second of MaxLifetime, or 1000 a second of one
// minute, per Node.
const DefaultMaxReplay = 65536

// OpenerConfig configures an Opener.
type OpenerConfig struct {
	// Key is the Node's X25519 private key (leasekey.Key.Private).
	// Required.
	Key *[32]byte
	// Public is the matching public key. If nil it is derived from Key.
	Public *[32]byte
	// EdgeKey is the Edge's Ed25519 public key, if already known. Until
	// one is set (here or with SetEdgeKey), every lease is malformed.
	EdgeKey ed25519.PublicKey
	// Now is the clock; nil means time.Now. Open calls it from many
	// goroutines at once.
	Now func() time.Time
	// Skew is the tolerated clock difference; zero or less means
	// DefaultSkew.
	Skew time.Duration
	// MaxReplay bounds the replay cache; zero or less means
	// DefaultMaxReplay.
	MaxReplay int
}

// Opener opens leases sealed to one Node key and keeps what that takes:
// the Edge's signing key, revocations and disables (Apply), the highest
// revision opened per credential, and the replay cache. A Node has one
// for its lifetime, across connections. It is safe for concurrent use.
type Opener struct {
	priv, pub [32]byte
	keyID     [KeyIDSize]byte
	now       func() time.Time
	skew      time.Duration

	mu                  sync.Mutex
	edgeKey             ed25519.PublicKey // nil until known
	latest              time.Time         // the latest time Open has seen
	revokedBelow        map[string]uint64 // credential -> revocation revision
	disabledProfiles    map[string]bool
	disabledCredentials map[string]bool
	highestOpened       map[string]uint64 // credential -> highest revision opened
	replay              *replayCache
}

// NewOpener returns an Opener for cfg. It panics if cfg.Key is nil or
// cfg.Public does not match it: those are programming errors.
func NewOpener(cfg OpenerConfig) *Opener {
	if cfg.Key == nil {
		panic("lease: NewOpener: no private key")
	}
	o := &Opener{
		priv:                *cfg.Key,
		now:                 cfg.Now,
		skew:                cfg.Skew,
		revokedBelow:        make(map[string]uint64),
		disabledProfiles:    make(map[string]bool),
		disabledCredentials: make(map[string]bool),
		highestOpened:       make(map[string]uint64),
	}
	pub, err := curve25519.X25519(o.priv[:], curve25519.Basepoint)
	if err != nil {
		panic("lease: NewOpener: " + err.Error())
	}
	o.pub = [32]byte(pub)
	if cfg.Public != nil && *cfg.Public != o.pub {
		panic("lease: NewOpener: public key does not match the private key")
	}
	o.keyID = KeyID(&o.pub)
	if o.now == nil {
		o.now = time.Now
	}
	if o.skew <= 0 {
		o.skew = DefaultSkew
	}
	if cfg.MaxReplay <= 0 {
		cfg.MaxReplay = DefaultMaxReplay
	}
	o.replay = newReplayCache(cfg.MaxReplay)
	o.SetEdgeKey(cfg.EdgeKey)
	return o
}

// SetEdgeKey sets the Edge's Ed25519 public key that leases must be signed
// with, as learned at registration; a new connection may bring a new one.
// A key of the wrong length (or nil) leaves no key known, so every lease
// is refused as malformed until a valid one is set.
func (o *Opener) SetEdgeKey(k ed25519.PublicKey) {
	var key ed25519.PublicKey
	if len(k) == ed25519.PublicKeySize {
		key = bytes.Clone(k)
	}
	o.mu.Lock()
	o.edgeKey = key
	o.mu.Unlock()
}

// Apply takes a CredentialNotice from the Edge. Revocation revisions only
// ever rise (a lower one than already known is ignored); the disabled
// profiles and credentials are the full current sets and replace the
// previous ones. A nil notice changes nothing.
func (o *Opener) Apply(n *wirepb.CredentialNotice) {
	if n == nil {
		return
	}
	profiles := make(map[string]bool, len(n.GetDisabledProfiles()))
	for _, p := range n.GetDisabledProfiles() {
		profiles[p] = true
	}
	creds := make(map[string]bool, len(n.GetDisabledCredentials()))
	for _, c := range n.GetDisabledCredentials() {
		creds[c] = true
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for c, r := range n.GetCredentialRevisions() {
		o.revokedBelow[c] = max(o.revokedBelow[c], r)
	}
	o.disabledProfiles = profiles
	o.disabledCredentials = creds
}

// Len returns how many lease ids the replay cache holds, for metrics.
func (o *Opener) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.replay.len()
}

// Open opens sealed for the dispatch want, runs every check of the package
// doc in order, and records the lease only if all of them pass. It returns
// a *RejectedError (errors.Is ErrRejected) naming the first check that
// failed, or ErrReplayCacheFull. Any error means: no provider call, and no
// other credential instead (S4). The caller wipes the returned Lease.
func (o *Opener) Open(sealed []byte, want Binding) (*Lease, error) {
	now := o.now()
	pb, err := o.unseal(sealed)
	if err != nil {
		return nil, err
	}
	l := fromProto(pb)
	if err := o.admit(l, want, now); err != nil {
		l.Wipe()
		return nil, err
	}
	return l, nil
}

// unseal runs the structural and cryptographic checks: everything that
// needs no state but the keys. It wipes every plaintext buffer it makes,
// and the parsed secret when it refuses.
func (o *Opener) unseal(sealed []byte) (*leasepb.Lease, error) {
	switch {
	case len(sealed) == 0:
		return nil, reject(Malformed, "empty")
	case len(sealed) > MaxSealedSize:
		return nil, reject(Malformed, fmt.Sprintf("%d bytes, over the limit of %d", len(sealed), MaxSealedSize))
	case len(sealed) < minSealedSize:
		return nil, reject(Malformed, fmt.Sprintf("%d bytes, shorter than the minimum of %d", len(sealed), minSealedSize))
	case sealed[0] != Version:
		return nil, reject(Malformed, fmt.Sprintf("unknown version byte %d", sealed[0]))
	}
	if id := sealed[1:headerSize]; subtle.ConstantTimeCompare(id, o.keyID[:]) != 1 {
		return nil, reject(WrongRecipient, fmt.Sprintf("sealed to key id %x, this Node's is %x", id, o.keyID))
	}
	o.mu.Lock()
	edgeKey := o.edgeKey
	o.mu.Unlock()
	if edgeKey == nil {
		return nil, reject(Malformed, "no Edge signing key known yet")
	}

	plain, ok := box.OpenAnonymous(nil, sealed[headerSize:], &o.pub, &o.priv)
	if !ok {
		return nil, reject(Malformed, "box does not open with this Node's key: tampered")
	}
	defer clear(plain)
	// Parse errors are summarised, not wrapped: the plaintext holds the
	// secret, and no detail of it should reach an error.
	var s leasepb.Signed
	defer func() { clear(s.Payload) }() // also a partly parsed one
	if err := proto.Unmarshal(plain, &s); err != nil {
		return nil, reject(Malformed, "sealed content is not a Signed")
	}
	if len(s.ProtoReflect().GetUnknown()) > 0 {
		return nil, reject(Malformed, "Signed has unknown fields")
	}
	if len(s.GetSignature()) != ed25519.SignatureSize {
		return nil, reject(Malformed, fmt.Sprintf("signature is %d bytes, want %d", len(s.GetSignature()), ed25519.SignatureSize))
	}
	msg := signedMessage(&o.pub, s.GetPayload())
	verified := ed25519.Verify(edgeKey, msg, s.GetSignature())
	clear(msg)
	if !verified {
		return nil, reject(Malformed, "bad signature: not signed by the Edge's key for this Node's key")
	}
	pb := new(leasepb.Lease)
	if err := proto.Unmarshal(s.GetPayload(), pb); err != nil {
		clear(pb.GetSecret())
		return nil, reject(Malformed, "signed payload is not a Lease")
	}
	if len(pb.ProtoReflect().GetUnknown()) > 0 {
		clear(pb.GetSecret())
		return nil, reject(Malformed, "Lease has unknown fields")
	}
	if msg := validate(pb); msg != "" {
		clear(pb.GetSecret())
		return nil, reject(Malformed, msg)
	}
	return pb, nil
}

// admit runs the checks that need the Opener's state, in the order of the
// package doc, and records the lease if all pass. One critical section
// covers the checks and the record, so of concurrent opens of one lease
// exactly one succeeds.
func (o *Opener) admit(l *Lease, want Binding, now time.Time) error {
	o.mu.Lock()
	defer o.mu.Unlock()

	// Expiry is judged against the latest time seen, so a clock that steps
	// backwards cannot revive a lease whose id the cache already forgot.
	if now.After(o.latest) {
		o.latest = now
	}
	o.replay.forget(o.latest)
	deadline := l.ExpiresAt.Add(o.skew)
	if o.latest.After(deadline) {
		return reject(Expired, fmt.Sprintf("expired at %s, now %s (skew %s)", stamp(l.ExpiresAt), stamp(o.latest), o.skew))
	}
	if l.IssuedAt.After(now.Add(o.skew)) {
		return reject(Expired, fmt.Sprintf("issued in the future at %s, now %s (skew %s)", stamp(l.IssuedAt), stamp(now), o.skew))
	}

	if o.disabledProfiles[l.Profile] {
		return reject(Disabled, fmt.Sprintf("profile %q is disabled", l.Profile))
	}
	if o.disabledCredentials[l.Credential] {
		return reject(Disabled, fmt.Sprintf("credential %q is disabled", l.Credential))
	}

	if r := o.revokedBelow[l.Credential]; l.Revision < r {
		return reject(Revoked, fmt.Sprintf("credential %q revision %d is revoked (revisions below %d are)", l.Credential, l.Revision, r))
	}

	if l.Generation != want.Generation {
		return reject(Stale, fmt.Sprintf("lease is for generation %d, the dispatch came on generation %d", l.Generation, want.Generation))
	}
	if h := o.highestOpened[l.Credential]; l.Revision < h {
		return reject(Stale, fmt.Sprintf("credential %q revision %d is older than revision %d already opened", l.Credential, l.Revision, h))
	}

	if diff := mismatches(&l.Binding, &want); len(diff) > 0 {
		return reject(Mismatched, "differs from the dispatch in "+strings.Join(diff, ", "))
	}

	if o.replay.has(l.ID) {
		return reject(Replayed, fmt.Sprintf("lease %q was already opened", l.ID))
	}
	if o.replay.full() {
		return fmt.Errorf("%w: %d live leases; lease %q not opened", ErrReplayCacheFull, o.replay.len(), l.ID)
	}
	o.replay.add(l.ID, deadline)
	o.highestOpened[l.Credential] = max(o.highestOpened[l.Credential], l.Revision)
	return nil
}

// mismatches names the bound fields of got that differ from want (not the
// generation: a different one is stale, not mismatched).
func mismatches(got, want *Binding) []string {
	var diff []string
	for _, f := range []struct {
		name      string
		got, want string
	}{
		{"principal", got.Principal, want.Principal},
		{"route", got.Route, want.Route},
		{"slot", got.Slot, want.Slot},
		{"profile", got.Profile, want.Profile},
		{"target", got.Target, want.Target},
		{"provider", got.Provider, want.Provider},
		{"node_id", got.NodeID, want.NodeID},
	} {
		if subtle.ConstantTimeCompare([]byte(f.got), []byte(f.want)) != 1 {
			diff = append(diff, f.name)
		}
	}
	return diff
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }
