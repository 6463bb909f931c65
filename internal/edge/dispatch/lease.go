package dispatch

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/iop-dev/iop/internal/edge/credentials"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/lease"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Credential leases (R11, S3, S4; ARCHITECTURE.md decision 9). When the
// profile of a request names a credential, every dispatch carries a lease
// of it: signed with the Edge's Ed25519 key, sealed to the X25519 key the
// chosen Node registered over its verified connection, and bound to the
// principal, route, slot, profile, target, provider, Node and generation.
// It is issued after the scheduler granted the slot, for that slot only; a
// failover issues a new one for the next candidate.

// LeaseMargin is added to the request's deadline for the lease's expiry.
// The Node opens a lease right after it admits the request, so the lease
// need only outlive the dispatch; its lifetime is also capped at
// lease.MaxLifetime.
const LeaseMargin = 30 * time.Second

// ErrCredentialUnavailable: the request's profile needs a credential that
// cannot be leased now (revoked and not reloaded, disabled, or the profile
// is disabled), or the chosen Node cannot be given one. Nothing was sent.
var ErrCredentialUnavailable = errors.New("credential unavailable")

// Credentials is where a profile's credential comes from
// (*credentials.Store).
type Credentials interface {
	Grant(profile string) (credentials.Grant, bool, error)
}

// Leases issues the leases of one Edge process.
type Leases struct {
	creds  Credentials
	issuer *lease.Issuer
}

// NewLeases returns an issuer that signs with key.
func NewLeases(creds Credentials, key ed25519.PrivateKey) *Leases {
	return &Leases{creds: creds, issuer: lease.NewIssuer(key)}
}

// PublicKey is the key Nodes verify leases with (sent at registration).
func (l *Leases) PublicKey() ed25519.PublicKey { return l.issuer.PublicKey() }

// seal returns the sealed lease and binding for one dispatch of work
// under plan, to candidate c on conn, or nil when the profile needs no
// credential. The lease's slot is the work's id and its attempt, n. The
// sealing is a function of its own: work without a credential does not
// push its frame (acquire says why that matters).
func (d *Dispatcher) seal(plan *Plan, id string, n int, c *sched.Candidate, conn Conn, deadline time.Time) ([]byte, *wirepb.LeaseBinding, error) {
	if plan.Profile.Credential == "" {
		return nil, nil, nil
	}
	return d.sealLease(plan, id+"#"+strconv.Itoa(n), c, conn, deadline)
}

// sealLease is seal for a profile with a credential.
func (d *Dispatcher) sealLease(plan *Plan, slotID string, c *sched.Candidate, conn Conn, deadline time.Time) ([]byte, *wirepb.LeaseBinding, error) {
	if d.leases == nil || d.leases.creds == nil {
		return nil, nil, fmt.Errorf("%w: profile %q needs credential %q, and this Edge issues no leases", ErrCredentialUnavailable, plan.Profile.Name, plan.Profile.Credential)
	}
	grant, ok, err := d.leases.creds.Grant(plan.Profile.Name)
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("%w: %w", ErrCredentialUnavailable, err)
	case !ok:
		return nil, nil, nil
	}
	defer clear(grant.Secret)
	// S3: a lease only goes to a connection whose identity mutual TLS
	// verified, sealed to the key it registered.
	if !conn.Verified() {
		return nil, nil, fmt.Errorf("%w: node %s is not authenticated (identity %q); leases need managed mode", ErrCredentialUnavailable, c.NodeID, conn.Identity())
	}
	key := conn.LeaseKey()
	if len(key) != 32 {
		return nil, nil, fmt.Errorf("%w: node %s registered no lease key", ErrCredentialUnavailable, c.NodeID)
	}
	now := time.Now()
	expires := deadline.Add(LeaseMargin)
	if limit := now.Add(lease.MaxLifetime); expires.After(limit) || deadline.IsZero() {
		expires = limit
	}
	b := lease.Binding{Principal: plan.Principal.Name, Route: plan.Route, Slot: slotID, Profile: plan.Profile.Name,
		Target: c.Target, Provider: c.Provider, NodeID: c.NodeID, Generation: conn.Generation()}
	sealed, err := d.leases.issuer.Issue(lease.Claims{ID: d.newID("lease"), Binding: b, Credential: grant.Credential,
		Revision: grant.Revision, IssuedAt: now, ExpiresAt: expires}, grant.Secret, (*[32]byte)(key))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrCredentialUnavailable, err)
	}
	return sealed, &wirepb.LeaseBinding{Principal: b.Principal, Route: b.Route, Slot: b.Slot, Profile: b.Profile}, nil
}
