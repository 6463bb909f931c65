// Package registrar is the Edge's side of Node enrollment: join tokens, the
// join exchange, certificate renewal over a Node's connection, revocation
// (`edged node remove`) and the check of every Node connection against it,
// all recorded in a Backend: a bbolt store in the Edge's data_dir
// (store.go), or, for a cluster of Edges, the cluster's PostgreSQL
// (pgstore.go). The token format and the join wire are in quicwire/enroll.
package registrar

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/quicwire"
	wireenroll "github.com/iop-dev/iop/quicwire/enroll"
	"github.com/iop-dev/iop/quicwire/pki"
)

// Token TTL bounds.
const (
	DefaultTokenTTL = time.Hour
	MinTokenTTL     = time.Second
	MaxTokenTTL     = 7 * 24 * time.Hour
)

// maxBackdate is how far before the moment of issue a certificate's
// validity starts, for clock skew between Edge and Node; a short lifetime
// gets a tenth of it instead.
const maxBackdate = time.Minute

// ErrDisabled is why joins and renewals are refused on an Edge without
// enrollment.ca_key_file.
var ErrDisabled = errors.New("this Edge does not issue Node certificates: set enrollment.ca_key_file (and data_dir) in its configuration")

// ErrUnknownNode is `node remove` or `node restore` of a Node the store
// does not know.
var ErrUnknownNode = errors.New("no such node in the enrollment store")

// ErrNodeRemoved is why a removed Node gets no token, no renewal and no
// admission, until `edged node restore` lifts the removal.
var ErrNodeRemoved = errors.New("the node was removed")

// ErrNotRemoved is `node restore` of a Node that is not removed.
var ErrNotRemoved = errors.New("not removed, nothing to restore")

// removedErr is ErrNodeRemoved for one Node, saying what to do next.
type removedErr struct {
	nodeID string
	at     time.Time
	next   string
}

// removedError is the refusal of a removed Node's certificate or renewal.
func removedError(nodeID string, at time.Time) error {
	return &removedErr{nodeID, at, fmt.Sprintf("its certificates are refused; to bring it back, `edged node restore %s`, then join it again (edged node add %s)", nodeID, nodeID)}
}

func (e *removedErr) Error() string {
	return fmt.Sprintf("node %s was removed at %s (edged node remove): %s", e.nodeID, e.at.UTC().Format(time.RFC3339), e.next)
}

func (e *removedErr) Is(target error) bool { return target == ErrNodeRemoved }

// Renewal spacing: the Edge issues a Node at most one certificate per
// maxRenewSpacing, or per a tenth of the lifetime if that is shorter (a
// Node renews at two thirds of it, so a Node whose renewal was lost can
// try again well before its certificate ends). Without it one Node could
// make the Edge sign and fsync hundreds of records a second.
const maxRenewSpacing = 10 * time.Minute

// renewSpacing is the least time between two certificates issued to one
// Node, for certificates valid for lifetime.
func renewSpacing(lifetime time.Duration) time.Duration {
	return min(maxRenewSpacing, lifetime/10)
}

// ErrRenewTooSoon is why a renewal is refused for coming too soon after
// the Node's last certificate (RenewLaterError says when to retry).
var ErrRenewTooSoon = errors.New("the node was issued a certificate too recently")

// RenewLaterError is a renewal refused for coming within the renewal
// spacing of the Node's last certificate. It says nothing against the
// Node's identity: the Node's current certificate stays valid, and the
// Node retries at RetryAt.
type RenewLaterError struct {
	NodeID string
	// Issued is when the Node's last certificate was issued.
	Issued time.Time
	// RetryAt is when a renewal is taken again.
	RetryAt time.Time
}

func (e *RenewLaterError) Error() string {
	return fmt.Sprintf("node %s was issued a certificate at %s, and the Edge issues a node at most one per %s: retry at %s",
		e.NodeID, e.Issued.UTC().Format(time.RFC3339), e.RetryAt.Sub(e.Issued), e.RetryAt.UTC().Format(time.RFC3339))
}

// Is matches ErrRenewTooSoon.
func (e *RenewLaterError) Is(target error) bool { return target == ErrRenewTooSoon }

// RetryTime is when to renew again: what the Node's connection handler
// tells the Node, without depending on this type.
func (e *RenewLaterError) RetryTime() time.Time { return e.RetryAt }

// Options configure a Service.
type Options struct {
	// EdgeID and TrustDomain are told to joining Nodes.
	EdgeID      string
	TrustDomain string
	// CACert is the CA of the deployment (identity.ca_file): its hash goes
	// into tokens.
	CACert *x509.Certificate
	// CA signs Node certificates; nil disables joins and renewals (no
	// enrollment.ca_key_file), which are then refused with ErrDisabled.
	CA *pki.CA
	// Lifetime of issued Node certificates.
	Lifetime time.Duration
	// Registry, if set, is where a removed Node's live connection is fenced,
	// and what List reads connections from.
	Registry *fleet.Registry
	// Refused, if set, counts refused joins and logs them without letting
	// a flood flood the log (frontdoor.Refusals); otherwise each is logged
	// at Warn.
	Refused Refuser
	// OnRemoved, if set, is called when an Edge of the cluster (this one
	// too) removed a Node, or when this Edge finds a removal it missed
	// while its database connection was down: PGStore tells within about
	// a second, after this Edge fenced the Node's connection in Registry.
	// It runs on the backend's listener: it must not block. The bbolt
	// store of a single Edge never calls it (Remove fences at once).
	OnRemoved func(nodeID string)
	Now       func() time.Time
	Logger    *slog.Logger
}

// Refuser records a refusal of kind with its message and log attributes.
type Refuser interface {
	Refuse(kind, msg string, args ...any)
}

// refuse records a refused join: they come from unauthenticated peers.
func (s *Service) refuse(msg string, args ...any) {
	if s.opts.Refused != nil {
		s.opts.Refused.Refuse("join", msg, args...)
		return
	}
	s.log.Warn(msg, args...)
}

// Service issues, renews and revokes Node identities. Its methods are safe
// for concurrent use; the store serializes writes.
type Service struct {
	opts  Options
	store Backend
	log   *slog.Logger
	joins chan struct{} // semaphore of join exchanges in progress (join.go)
	// sources counts the join exchanges in progress per source address
	// (join.go).
	sources joinSources
}

// New returns a service over store. When store tells of changes made by
// other Edges (PGStore), the Service fences the connection of a Node
// removed elsewhere, as Remove does for its own.
func New(store Backend, opts Options) *Service {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Lifetime <= 0 {
		opts.Lifetime = 24 * time.Hour
	}
	s := &Service{opts: opts, store: store, log: opts.Logger, joins: make(chan struct{}, maxJoins)}
	if w, ok := store.(watched); ok {
		w.watch(s.removedElsewhere)
	}
	return s
}

// watched is a backend that tells of removals and restores made by any
// Edge of the cluster, this one's too.
type watched interface {
	watch(onRemoved func(nodeID string))
}

// removedElsewhere fences the connection of a Node that an Edge of the
// cluster removed, then tells Options.OnRemoved. This Edge's own removals
// come here too: RemoveBy has usually fenced the connection by then, but
// the notice may come first (either fences; Fence is idempotent).
func (s *Service) removedElsewhere(nodeID string) {
	if reg := s.opts.Registry; reg != nil {
		if conn, ok := reg.Current(nodeID); ok && conn.State() != fleet.Fenced {
			reg.Fence(conn, quicwire.CloseUnauthenticated, "node removed: its certificate is revoked")
			s.log.Info("node removed by another Edge: connection fenced", "node", nodeID)
		}
	}
	if s.opts.OnRemoved != nil {
		s.opts.OnRemoved(nodeID)
	}
}

// CACert is the CA certificate the Service's tokens name.
func (s *Service) CACert() *x509.Certificate { return s.opts.CACert }

// Renews reports whether the Service issues certificates (has the CA key).
func (s *Service) Renews() bool { return s.opts.CA != nil }

// NewToken makes a single-use join token for nodeID, valid for ttl, and
// records it (its secret only as a hash). A removed Node gets none
// (ErrNodeRemoved) until `edged node restore` lifts its removal: a token
// must not undo a removal by the way.
func (s *Service) NewToken(nodeID string, ttl time.Duration) (wireenroll.Token, time.Time, error) {
	return s.NewTokenBy(context.Background(), ActorAdminSocket, nodeID, ttl)
}

// NewTokenBy is NewToken on behalf of actor (the audit log's).
func (s *Service) NewTokenBy(ctx context.Context, actor, nodeID string, ttl time.Duration) (wireenroll.Token, time.Time, error) {
	if err := quicwire.ValidateID(nodeID); err != nil {
		return wireenroll.Token{}, time.Time{}, fmt.Errorf("node id: %w", err)
	}
	if ttl < MinTokenTTL || ttl > MaxTokenTTL {
		return wireenroll.Token{}, time.Time{}, fmt.Errorf("--ttl %s: want from %s to %s", ttl, MinTokenTTL, MaxTokenTTL)
	}
	if s.opts.CACert == nil {
		return wireenroll.Token{}, time.Time{}, errors.New("no CA certificate (identity.ca_file) to name in the token")
	}
	id := make([]byte, wireenroll.TokenIDSize)
	secret := make([]byte, wireenroll.TokenSecretSize)
	rand.Read(id)
	rand.Read(secret)
	tok := wireenroll.Token{ID: base64.RawURLEncoding.EncodeToString(id), Secret: secret, CAHash: wireenroll.CAHash(s.opts.CACert)}
	now := s.opts.Now()
	rec := TokenRecord{ID: tok.ID, NodeID: nodeID, SecretHash: wireenroll.SecretHash(secret), Created: now, Expires: now.Add(ttl)}
	if err := s.store.AddToken(withActor(ctx, actor), rec); err != nil {
		return wireenroll.Token{}, time.Time{}, err
	}
	s.log.Info("join token made", "node", nodeID, "token", tok.ID, "expires", rec.Expires.UTC().Format(time.RFC3339))
	return tok, rec.Expires, nil
}

// sign issues a certificate for nodeID's key in csr, valid from now for
// the configured lifetime (backdated a little for clock skew).
func (s *Service) sign(nodeID string, csr *x509.CertificateRequest, via string) (*x509.Certificate, CertRecord, error) {
	if s.opts.CA == nil {
		return nil, CertRecord{}, ErrDisabled
	}
	backdate := min(maxBackdate, s.opts.Lifetime/10)
	now := s.opts.Now()
	cert, err := s.opts.CA.Sign(quicwire.NodeIdentity(s.opts.TrustDomain, nodeID), csr.PublicKey,
		pki.Options{NotBefore: now.Add(-backdate), Validity: s.opts.Lifetime + backdate})
	if err != nil {
		return nil, CertRecord{}, err
	}
	return cert, CertRecord{Serial: Serial(cert), NodeID: nodeID, NotBefore: cert.NotBefore, NotAfter: cert.NotAfter, Via: via, Issued: now}, nil
}

// Serial is how the store and `edged node list` spell a certificate's
// serial number: lowercase hex.
func Serial(c *x509.Certificate) string { return c.SerialNumber.Text(16) }

// parseCSR parses and checks a certificate request: only its key and
// signature matter; the identity is the Edge's to decide.
func parseCSR(der []byte) (*x509.CertificateRequest, error) {
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}
	if err := checkKey(csr.PublicKey); err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}
	return csr, nil
}

// ErrWeakKey is why a certificate request is refused for its key.
var ErrWeakKey = errors.New("the node's key is too weak")

// minRSABits is the smallest RSA key the Edge certifies (NIST SP 800-131A
// has disallowed RSA-1024 signatures since 2013).
const minRSABits = 2048

// keysTaken says what checkKey takes.
const keysTaken = "the Edge takes RSA-2048 or larger, ECDSA P-256, P-384 or P-521, or Ed25519 (noded join makes an ECDSA P-256 key)"

// checkKey refuses a key weaker than RSA-2048 or ECDSA P-256: a
// certificate lasts, and whoever factors its key is the Node.
func checkKey(pub any) error {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if bits := k.N.BitLen(); bits < minRSABits {
			return fmt.Errorf("%w: RSA-%d; %s", ErrWeakKey, bits, keysTaken)
		}
		return nil
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
			return nil
		}
		return fmt.Errorf("%w: ECDSA %s; %s", ErrWeakKey, k.Curve.Params().Name, keysTaken)
	case ed25519.PublicKey:
		return nil
	}
	return fmt.Errorf("%w: a %T key; %s", ErrWeakKey, pub, keysTaken)
}

// Renew issues a new certificate to the Node of a verified, admitted
// connection (nodeID is its identity), for the key of csrDER. It returns
// the chain: the certificate, then the CA. A removed Node is refused
// (ErrNodeRemoved), and so is a renewal within the renewal spacing of the
// Node's last certificate (a *RenewLaterError, ErrRenewTooSoon): the
// decision and the record are one transaction (Store.Renew).
func (s *Service) Renew(nodeID string, csrDER []byte) ([][]byte, error) {
	if s.opts.CA == nil {
		return nil, ErrDisabled
	}
	csr, err := parseCSR(csrDER)
	if err != nil {
		return nil, err
	}
	now := s.opts.Now()
	spacing := renewSpacing(s.opts.Lifetime)
	check := func(n NodeRecord) error {
		if !n.Removed.IsZero() {
			return removedError(nodeID, n.Removed)
		}
		if retry := n.Issued.Add(spacing); !n.Issued.IsZero() && now.Before(retry) {
			return &RenewLaterError{NodeID: nodeID, Issued: n.Issued, RetryAt: retry}
		}
		return nil
	}
	var cert *x509.Certificate
	issue := func() (rec CertRecord, err error) {
		cert, rec, err = s.sign(nodeID, csr, "renew")
		return rec, err
	}
	ctx := withActor(context.Background(), "node "+nodeID)
	rec, err := s.store.Renew(ctx, nodeID, check, issue, now)
	if err != nil {
		return nil, err
	}
	s.log.Info("node certificate renewed", "node", nodeID, "serial", rec.Serial, "not_after", rec.NotAfter.UTC().Format(time.RFC3339))
	return [][]byte{cert.Raw, s.opts.CACert.Raw}, nil
}

// Admit checks a verified Node certificate against the store: a removed
// Node or a revoked serial is refused (the caller closes the connection as
// unauthenticated). An admitted connection is recorded as the Node's last
// sighting. A store that cannot be read refuses: fail closed.
func (s *Service) Admit(nodeID string, leaf *x509.Certificate) error {
	if err := s.Check(nodeID, leaf); err != nil {
		return err
	}
	if err := s.store.Seen(context.Background(), nodeID, Serial(leaf), s.opts.Now()); err != nil {
		s.log.Warn("could not record node sighting", "node", nodeID, "err", err)
	}
	return nil
}

// Check is Admit without recording the sighting: the Edge checks again
// once the connection is registered, so that a removal that landed
// between Admit and the registration still fences it. While the Node is
// removed every certificate of it is refused, whatever its serial; once
// the removal is lifted, the ones it revoked stay refused, and so does one
// the store does not know (made by hand) that starts before the removal.
func (s *Service) Check(nodeID string, leaf *x509.Certificate) error {
	serial := Serial(leaf)
	st, err := s.store.Standing(context.Background(), nodeID, serial)
	if err != nil {
		return fmt.Errorf("revocation check: %w", err)
	}
	switch {
	case !st.NodeRemoved.IsZero():
		return removedError(nodeID, st.NodeRemoved)
	case !st.CertRevoked.IsZero():
		return fmt.Errorf("certificate %s of node %s was revoked at %s (edged node remove); join the node again for a new one", serial, nodeID, st.CertRevoked.UTC().Format(time.RFC3339))
	case !st.CertKnown && leaf.NotBefore.Before(st.RevokedBefore):
		return fmt.Errorf("certificate %s of node %s starts at %s, before the node's removal at %s, and this Edge did not issue it: "+
			"once a removal is lifted, only certificates that start after it are admitted (edged tls cert create starts one a minute back); "+
			"join the node again (edged node add %s, then noded join)",
			serial, nodeID, leaf.NotBefore.UTC().Format(time.RFC3339), st.RevokedBefore.UTC().Format(time.RFC3339), nodeID)
	}
	return nil
}

// Restore lifts the removal of nodeID and returns when it was removed. It
// lets nothing in by itself: the certificates the removal revoked stay
// refused, and so do hand-made ones from before it. What it allows is a
// new token (`edged node add`), so the Node can join again.
func (s *Service) Restore(nodeID string) (removedAt time.Time, err error) {
	return s.RestoreBy(context.Background(), ActorAdminSocket, nodeID)
}

// RestoreBy is Restore on behalf of actor (the audit log's).
func (s *Service) RestoreBy(ctx context.Context, actor, nodeID string) (removedAt time.Time, err error) {
	if err := quicwire.ValidateID(nodeID); err != nil {
		return time.Time{}, fmt.Errorf("node id: %w", err)
	}
	removedAt, err = s.store.Restore(withActor(ctx, actor), nodeID, s.opts.Now())
	if err != nil {
		return time.Time{}, err
	}
	s.log.Info("node removal lifted", "node", nodeID, "removed", removedAt.UTC().Format(time.RFC3339))
	return removedAt, nil
}

// Remove revokes every certificate issued to nodeID, refuses the Node from
// now on (until `edged node restore` lifts the removal and it joins again),
// drops its pending tokens, and fences its live connection at once.
func (s *Service) Remove(nodeID string) (revoked []string, fenced bool, err error) {
	return s.RemoveBy(context.Background(), ActorAdminSocket, nodeID)
}

// RemoveBy is Remove on behalf of actor (the audit log's).
func (s *Service) RemoveBy(ctx context.Context, actor, nodeID string) (revoked []string, fenced bool, err error) {
	var conn *fleet.Conn
	if reg := s.opts.Registry; reg != nil {
		conn, _ = reg.Current(nodeID)
	}
	fencedBefore := conn != nil && conn.State() == fleet.Fenced
	// A Node the store never saw but the Edge knows from a connection
	// (a certificate made by hand) is marked removed all the same.
	known, revoked, err := s.store.Remove(withActor(ctx, actor), nodeID, s.opts.Now(), conn != nil)
	if err != nil {
		return nil, false, err
	}
	if conn != nil && !fencedBefore {
		// In a cluster this Edge hears the removal's notice too, and may
		// have fenced the connection already (idempotent): the removal
		// fenced it either way.
		s.opts.Registry.Fence(conn, quicwire.CloseUnauthenticated, "node removed: its certificate is revoked")
		fenced = true
	}
	if !known && conn == nil {
		return nil, false, fmt.Errorf("%w: %s", ErrUnknownNode, nodeID)
	}
	s.log.Info("node removed", "node", nodeID, "revoked_serials", strings.Join(revoked, ","), "fenced", fenced)
	return revoked, fenced, nil
}

// NodeStatus is one Node as `edged node list` shows it.
type NodeStatus struct {
	ID string `json:"id"`
	// Identity is the Node's SPIFFE identity.
	Identity string    `json:"identity"`
	Removed  time.Time `json:"removed,omitzero"`
	LastSeen time.Time `json:"last_seen,omitzero"`
	// Connected is the state of its current connection at the Edge
	// ("ready", "registering", ...), empty when none or not known (the
	// store read without a running Edge).
	Connected    string         `json:"connected,omitempty"`
	Certificates []CertRecord   `json:"certificates,omitempty"`
	Tokens       []PendingToken `json:"pending_tokens,omitempty"`
}

// PendingToken is an unused join token, never its secret.
type PendingToken struct {
	ID      string    `json:"id"`
	Expires time.Time `json:"expires"`
}

// List returns every Node the store knows, by id, with its certificates
// (newest last) and unused tokens.
func (s *Service) List() ([]NodeStatus, error) {
	return List(s.store, s.opts.TrustDomain, s.opts.Registry, s.opts.Now())
}

// List reads the Nodes of store; reg, if set, adds their connection state
// as of now.
func List(store Backend, trustDomain string, reg *fleet.Registry, now time.Time) ([]NodeStatus, error) {
	c, err := store.Contents(context.Background())
	if err != nil {
		return nil, err
	}
	byID := map[string]*NodeStatus{}
	node := func(id string) *NodeStatus {
		if n, ok := byID[id]; ok {
			return n
		}
		n := &NodeStatus{ID: id, Identity: quicwire.NodeIdentity(trustDomain, id).String()}
		byID[id] = n
		return n
	}
	for _, r := range c.Nodes {
		n := node(r.ID)
		n.Removed, n.LastSeen = r.Removed, r.LastSeen
	}
	for _, r := range c.Certs {
		n := node(r.NodeID)
		n.Certificates = append(n.Certificates, r)
	}
	for _, t := range c.Tokens {
		if t.Used.IsZero() {
			n := node(t.NodeID)
			n.Tokens = append(n.Tokens, PendingToken{ID: t.ID, Expires: t.Expires})
		}
	}
	out := make([]NodeStatus, 0, len(byID))
	for _, n := range byID {
		slices.SortFunc(n.Certificates, func(a, b CertRecord) int { return a.issuedAt().Compare(b.issuedAt()) })
		if reg != nil {
			if conn, ok := reg.Current(n.ID); ok {
				n.Connected = string(conn.State())
				// The store has the last admission; a live connection is
				// seen now, a fenced one until its fence.
				seen := now
				if conn.State() == fleet.Fenced {
					seen = conn.FencedAt()
				}
				if seen.After(n.LastSeen) {
					n.LastSeen = seen
				}
			}
		}
		out = append(out, *n)
	}
	slices.SortFunc(out, func(a, b NodeStatus) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}
