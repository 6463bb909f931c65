package registrar

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/quicwire"
	wireenroll "github.com/iop-dev/iop/quicwire/enroll"
	"github.com/iop-dev/iop/quicwire/pki"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// fixture is a Service over a store in a temporary directory, on a clock
// the test moves; under onPostgreSQL, over a PGStore.
type fixture struct {
	t   testing.TB
	dir string
	ca  *pki.CA
	now time.Time
	svc *Service
	st  *Store // the bbolt store; nil on PostgreSQL
	pg  *pgEnv // set on PostgreSQL
	// backend is st or the PGStore.
	backend Backend
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	return newFixtureOn(t, fixturePG)
}

// newFixtureOn is newFixture over pg (nil: a bbolt store).
func newFixtureOn(t testing.TB, pg *pgEnv) *fixture {
	t.Helper()
	ca, err := pki.NewCA("iop.test", pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// PostgreSQL keeps microseconds: so does the clock, so that times read
	// back are equal to the ones written.
	f := &fixture{t: t, dir: t.TempDir(), ca: ca, now: time.Now().Truncate(time.Microsecond), pg: pg}
	f.open()
	return f
}

func (f *fixture) open() {
	f.t.Helper()
	if f.pg != nil {
		f.backend = f.pg.open(f.t)
	} else {
		st, err := OpenStore(f.dir, time.Second, f.now)
		if err != nil {
			f.t.Fatal(err)
		}
		f.t.Cleanup(func() { st.Close() })
		f.st, f.backend = st, st
	}
	f.svc = New(f.backend, Options{EdgeID: "edge-1", TrustDomain: "iop.test", CACert: f.ca.Cert, CA: f.ca,
		Lifetime: time.Hour, Now: func() time.Time { return f.now }})
}

// restart closes the store and opens it again, as an Edge restart does.
func (f *fixture) restart() {
	f.t.Helper()
	if f.pg != nil {
		f.pg.close()
	} else if err := f.st.Close(); err != nil {
		f.t.Fatal(err)
	}
	f.open()
}

func csr(t testing.TB) []byte {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func (f *fixture) join(tok wireenroll.Token) *wirepb.JoinResponse {
	return f.svc.join(&wirepb.JoinRequest{TokenId: tok.ID, Secret: tok.Secret, Csr: csr(f.t)}, "test")
}

func TestATokenJoinsOnceAndIssuesTheNodesIdentity(t *testing.T) {
	f := newFixture(t)
	tok, _, err := f.svc.NewToken("gpu-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !tok.MatchesCA(f.ca.Cert) {
		t.Error("the token does not name the Edge's CA")
	}
	resp := f.join(tok)
	if resp.GetRefusal() != 0 {
		t.Fatalf("refused: %v %s", resp.GetRefusal(), resp.GetRefusalDetail())
	}
	leaf, err := x509.ParseCertificate(resp.GetChain()[0])
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := quicwire.IdentityFromCert(leaf); id != quicwire.NodeIdentity("iop.test", "gpu-1") {
		t.Errorf("issued %v", id)
	}
	if got := leaf.NotAfter.Sub(f.now); got < time.Hour-time.Second || got > time.Hour+time.Second {
		t.Errorf("lifetime from now %s, want 1h", got)
	}
	again := f.join(tok)
	if again.GetRefusal() != wirepb.JoinRefusal_JOIN_REFUSAL_USED_TOKEN || len(again.GetChain()) != 0 {
		t.Errorf("second use: %v %s, chain %d", again.GetRefusal(), again.GetRefusalDetail(), len(again.GetChain()))
	}
}

func TestRefusedJoinsIssueNothingAndKeepTheToken(t *testing.T) {
	f := newFixture(t)
	tok, _, _ := f.svc.NewToken("gpu-1", time.Minute)
	wrong := tok
	wrong.Secret = make([]byte, wireenroll.TokenSecretSize)
	unknown := tok
	unknown.ID = "AAAAAAAA"
	for _, tc := range []struct {
		name string
		tok  wireenroll.Token
		csr  []byte
		want wirepb.JoinRefusal
	}{
		{"wrong secret", wrong, csr(t), wirepb.JoinRefusal_JOIN_REFUSAL_UNKNOWN_TOKEN},
		{"unknown token", unknown, csr(t), wirepb.JoinRefusal_JOIN_REFUSAL_UNKNOWN_TOKEN},
		{"garbage request", tok, []byte("not a csr"), wirepb.JoinRefusal_JOIN_REFUSAL_BAD_REQUEST},
	} {
		resp := f.svc.join(&wirepb.JoinRequest{TokenId: tc.tok.ID, Secret: tc.tok.Secret, Csr: tc.csr}, "test")
		if resp.GetRefusal() != tc.want || len(resp.GetChain()) != 0 {
			t.Errorf("%s: %v %q, want %v and no chain", tc.name, resp.GetRefusal(), resp.GetRefusalDetail(), tc.want)
		}
	}
	if resp := f.join(tok); resp.GetRefusal() != 0 {
		t.Errorf("the right secret after refused attempts: %v %s", resp.GetRefusal(), resp.GetRefusalDetail())
	}
}

func TestAnExpiredTokenIsRefused(t *testing.T) {
	f := newFixture(t)
	tok, exp, _ := f.svc.NewToken("gpu-1", time.Minute)
	f.now = exp
	resp := f.join(tok)
	if resp.GetRefusal() != wirepb.JoinRefusal_JOIN_REFUSAL_EXPIRED_TOKEN || !strings.Contains(resp.GetRefusalDetail(), "edged node add gpu-1") {
		t.Errorf("at expiry: %v %q", resp.GetRefusal(), resp.GetRefusalDetail())
	}
	content, _ := f.backend.Contents(t.Context())
	if len(content.Certs) != 0 {
		t.Errorf("certificates issued: %+v", content.Certs)
	}
}

func TestAnEdgeWithoutTheCAKeyRefusesJoinsSayingWhy(t *testing.T) {
	f := newFixture(t)
	tok, _, _ := f.svc.NewToken("gpu-1", time.Minute)
	f.svc.opts.CA = nil
	resp := f.join(tok)
	if resp.GetRefusal() != wirepb.JoinRefusal_JOIN_REFUSAL_UNAVAILABLE || !strings.Contains(resp.GetRefusalDetail(), "enrollment.ca_key_file") {
		t.Errorf("%v %q", resp.GetRefusal(), resp.GetRefusalDetail())
	}
	if _, err := f.svc.Renew("gpu-1", csr(t)); !errors.Is(err, ErrDisabled) {
		t.Errorf("renew: %v", err)
	}
}

// The store outlives the Edge: a token made before a restart joins once
// after it, and a removal made before it still refuses.
func TestTokensAndRevocationsSurviveARestart(t *testing.T) {
	f := newFixture(t)
	tok, _, _ := f.svc.NewToken("gpu-1", time.Hour)
	f.restart()
	resp := f.join(tok)
	if resp.GetRefusal() != 0 {
		t.Fatalf("after restart: %v %s", resp.GetRefusal(), resp.GetRefusalDetail())
	}
	leaf, _ := x509.ParseCertificate(resp.GetChain()[0])
	f.restart()
	if resp := f.join(tok); resp.GetRefusal() != wirepb.JoinRefusal_JOIN_REFUSAL_USED_TOKEN {
		t.Errorf("used token after restart: %v", resp.GetRefusal())
	}
	if err := f.svc.Admit("gpu-1", leaf); err != nil {
		t.Fatalf("admit: %v", err)
	}
	revoked, _, err := f.svc.Remove("gpu-1")
	if err != nil || len(revoked) != 1 || revoked[0] != Serial(leaf) {
		t.Fatalf("remove: %v %v", revoked, err)
	}
	f.restart()
	if err := f.svc.Admit("gpu-1", leaf); err == nil || !strings.Contains(err.Error(), "was removed") {
		t.Errorf("admit after removal and restart: %v", err)
	}
	if _, err := f.svc.Renew("gpu-1", csr(t)); err == nil {
		t.Error("a removed node renewed")
	}
	if _, _, err := f.svc.Remove("nobody"); !errors.Is(err, ErrUnknownNode) {
		t.Errorf("remove unknown: %v", err)
	}
	// Lifting the removal (edged node restore) lets it join again with a
	// new token.
	if _, err := f.svc.Restore("gpu-1"); err != nil {
		t.Fatal(err)
	}
	tok2, _, _ := f.svc.NewToken("gpu-1", time.Hour)
	resp = f.join(tok2)
	leaf2, _ := x509.ParseCertificate(resp.GetChain()[0])
	if err := f.svc.Admit("gpu-1", leaf2); err != nil {
		t.Errorf("rejoined node: %v", err)
	}
	if err := f.svc.Admit("gpu-1", leaf); err == nil {
		t.Error("the revoked certificate is admitted again")
	}
}

func TestRenewIssuesTheConnectionsIdentity(t *testing.T) {
	f := newFixture(t)
	chain, err := f.svc.Renew("gpu-1", csr(t))
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(chain[0])
	if id, _ := quicwire.IdentityFromCert(leaf); id.ID != "gpu-1" {
		t.Errorf("renewed %v", id)
	}
	list, _ := f.svc.List()
	if len(list) != 1 || len(list[0].Certificates) != 1 || list[0].Certificates[0].Via != "renew" {
		t.Errorf("list: %+v", list)
	}
	if _, err := f.svc.Renew("gpu-1", []byte("junk")); err == nil {
		t.Error("renewed a junk request")
	}
}

func TestTheStoreIsOneProcesssAtATime(t *testing.T) {
	f := newFixture(t)
	if _, err := OpenStore(f.dir, 50*time.Millisecond, f.now); !errors.Is(err, ErrStoreLocked) {
		t.Errorf("second open: %v, want ErrStoreLocked", err)
	}
}

// A Node with a certificate made by hand (unknown to the store) that is
// connected is fenced by `node remove` and refused from then on.
func TestRemovingAConnectedHandMadeNodeFencesAndRefusesIt(t *testing.T) {
	f := newFixture(t)
	reg := fleet.New(fleet.Options{})
	f.svc.opts.Registry = reg
	conn := reg.Register(fleet.ConnInfo{NodeID: "hand-1", Identity: "spiffe://iop.test/node/hand-1"})
	cert, err := f.ca.IssueTLS(quicwire.NodeIdentity("iop.test", "hand-1"), pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, fenced, err := f.svc.Remove("hand-1"); err != nil || !fenced {
		t.Fatalf("remove: fenced=%v err=%v", fenced, err)
	}
	if code, _, _ := conn.FenceReason(); conn.State() != fleet.Fenced || code != quicwire.CloseUnauthenticated {
		t.Errorf("connection %s (%s), want fenced unauthenticated", conn.State(), code)
	}
	if err := f.svc.Admit("hand-1", cert.Leaf); err == nil {
		t.Error("the removed hand-made node is admitted")
	}
	list, err := f.svc.List()
	if err != nil || len(list) != 1 || list[0].Connected != "fenced" || !list[0].LastSeen.Equal(conn.FencedAt()) || list[0].Removed.IsZero() {
		t.Errorf("list: %+v, %v; want hand-1 removed, fenced, last seen at its fence %s", list, err, conn.FencedAt())
	}
}
