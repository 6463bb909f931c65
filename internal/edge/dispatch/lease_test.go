package dispatch

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"golang.org/x/crypto/nacl/box"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/credentials"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/lease"
)

type fakeCreds struct {
	err     error
	granted int
}

func (f *fakeCreds) Grant(profile string) (credentials.Grant, bool, error) {
	if f.err != nil {
		return credentials.Grant{}, false, f.err
	}
	f.granted++
	return credentials.Grant{Credential: "upstream", Kind: "bearer", Revision: 4, Secret: []byte("sk-secret")}, true, nil
}

// R11: the lease the gateway seals for a dispatch opens on that Node, for
// exactly that dispatch: principal, route, slot, profile, target, provider,
// Node and generation; S3: only for a verified connection.
func TestSealBindsTheLeaseToTheDispatch(t *testing.T) {
	_, edgeKey, _ := ed25519.GenerateKey(rand.Reader)
	pub, priv, _ := box.GenerateKey(rand.Reader)
	creds := &fakeCreds{}
	d := New(edgeconfig.Default(), nil, nil, Options{Leases: NewLeases(creds, edgeKey)})
	reg := fleet.New(fleet.Options{GenerationBase: 100})
	conn := reg.Register(fleet.ConnInfo{NodeID: "gpu-1", Identity: "spiffe://iop.test/node/gpu-1", LeaseKey: pub[:]})
	plan := Plan{Principal: auth.Principal{Name: "alice"}, Model: "gpt", Route: "chat", Profile: edgeconfig.Profile{Name: "hosted", Credential: "upstream"}}
	c := sched.Candidate{NodeID: "gpu-1", Generation: conn.Generation(), Provider: "openai", Target: "gpt-4o"}
	deadline := time.Now().Add(time.Minute)

	sealed, b, err := d.seal(&plan, "run-1", 0, &c, conn, deadline)
	if err != nil {
		t.Fatal(err)
	}
	if b.GetPrincipal() != "alice" || b.GetRoute() != "chat" || b.GetSlot() != "run-1#0" || b.GetProfile() != "hosted" {
		t.Errorf("binding = %v", b)
	}
	opener := lease.NewOpener(lease.OpenerConfig{Key: priv, Public: pub, EdgeKey: d.leases.PublicKey()})
	want := lease.Binding{Principal: "alice", Route: "chat", Slot: "run-1#0", Profile: "hosted", Target: "gpt-4o",
		Provider: "openai", NodeID: "gpu-1", Generation: conn.Generation()}
	l, err := opener.Open(sealed, want)
	if err != nil {
		t.Fatalf("the Node cannot open the lease: %v", err)
	}
	if string(l.Secret) != "sk-secret" || l.Revision != 4 || l.Credential != "upstream" {
		t.Errorf("lease = %+v", l.Claims)
	}
	if l.ExpiresAt.Before(deadline) || l.ExpiresAt.After(deadline.Add(LeaseMargin+time.Second)) {
		t.Errorf("expires %v, want the deadline %v plus %v", l.ExpiresAt, deadline, LeaseMargin)
	}

	// A profile without a credential gets no lease.
	plain := plan
	plain.Profile.Credential = ""
	if sealed, b, err := d.seal(&plain, "run-2", 0, &c, conn, deadline); sealed != nil || b != nil || err != nil {
		t.Errorf("no credential: %v %v %v", sealed, b, err)
	}

	// S3: an unauthenticated (loopback) connection is never given one.
	loop := reg.Register(fleet.ConnInfo{NodeID: "dev", Identity: "loopback", LeaseKey: pub[:]})
	if _, _, err := d.seal(&plan, "run-3", 0, &c, loop, deadline); !errors.Is(err, ErrCredentialUnavailable) {
		t.Errorf("loopback connection: %v, want ErrCredentialUnavailable", err)
	}

	// S4: a credential the store refuses (revoked, disabled) is not leased.
	creds.err = credentials.ErrCredentialRevoked
	if _, _, err := d.seal(&plan, "run-4", 0, &c, conn, deadline); !errors.Is(err, ErrCredentialUnavailable) || !errors.Is(err, credentials.ErrCredentialRevoked) {
		t.Errorf("revoked credential: %v", err)
	}

	// An Edge that issues no leases refuses rather than run without.
	bare := New(edgeconfig.Default(), nil, nil, Options{})
	if _, _, err := bare.seal(&plan, "run-5", 0, &c, conn, deadline); !errors.Is(err, ErrCredentialUnavailable) {
		t.Errorf("no issuer: %v", err)
	}
}
