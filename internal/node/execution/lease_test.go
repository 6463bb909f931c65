package execution

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/nacl/box"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire/lease"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// R11, S4 on the Node: leases are opened after admission, immediately
// before the provider call; every refusal fails closed with lease_rejected
// and its reason, and the provider gets no call at all.

const leaseSecret = "sk-live-never-on-disk"

type leaseKit struct {
	issuer    *lease.Issuer
	nodePub   *[32]byte
	opener    *lease.Opener
	sess      *transport.Session
	now       time.Time
	otherEdge *lease.Issuer
	otherNode *[32]byte
}

func newLeaseKit(t *testing.T) *leaseKit {
	t.Helper()
	_, edgeKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, otherEdge, _ := ed25519.GenerateKey(rand.Reader)
	pub, priv, err := box.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	otherPub, _, _ := box.GenerateKey(rand.Reader)
	k := &leaseKit{issuer: lease.NewIssuer(edgeKey), nodePub: pub, otherEdge: lease.NewIssuer(otherEdge), otherNode: otherPub,
		sess: transport.NewSession("node-a", 7, time.Now()), now: time.Now()}
	k.opener = lease.NewOpener(lease.OpenerConfig{Key: priv, Public: pub, EdgeKey: k.issuer.PublicKey(), Now: func() time.Time { return k.now }})
	return k
}

// claims is a lease for leaseRun's request on node-a, generation 7.
func (k *leaseKit) claims(id string) lease.Claims {
	return lease.Claims{ID: id, Binding: lease.Binding{Principal: "alice", Route: "chat", Slot: "run-1#0", Profile: "hosted",
		Target: "m", Provider: "p", NodeID: "node-a", Generation: 7},
		Credential: "upstream", Revision: 2, IssuedAt: k.now, ExpiresAt: k.now.Add(time.Minute)}
}

func (k *leaseKit) seal(t *testing.T, c lease.Claims) []byte {
	t.Helper()
	b, err := k.issuer.Issue(c, []byte(leaseSecret), k.nodePub)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func leaseRun(id string, sealed []byte) *wirepb.RunRequest {
	r := run(id)
	r.Provider = "p"
	r.SealedLease = sealed
	r.Binding = &wirepb.LeaseBinding{Principal: "alice", Route: "chat", Slot: "run-1#0", Profile: "hosted"}
	return r
}

func okPlugin() *fakePlugin {
	return newFakePlugin(func(context.Context, *wirepb.RunRequest, func(*wirepb.RunEvent) error) (*sdk.Result, error) {
		return &sdk.Result{DoneReason: "stop"}, nil
	})
}

func leaseHandler(t *testing.T, k *leaseKit, pl Plugin, capacity int) *Handler {
	t.Helper()
	_, h := onlineSet(t, capacity, pl)
	h.leases = k.opener
	return h
}

func serveWith(h *Handler, sess *transport.Session, req *wirepb.RunRequest) *wirepb.RunEvent {
	st := newFakeStream()
	defer st.cancel()
	h.serveRun(context.Background(), sess, req, st)
	evs := st.events()
	return evs[len(evs)-1]
}

// A valid lease gives the adapter the credential for its call, and not
// the lease itself.
func TestLeaseGivesTheAdapterItsCredential(t *testing.T) {
	k := newLeaseKit(t)
	pl := okPlugin()
	h := leaseHandler(t, k, pl, 1)
	if term := serveWith(h, k.sess, leaseRun("r1", k.seal(t, k.claims("l1")))); term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
		t.Fatalf("terminal = %v", term)
	}
	creds, leases := pl.credentials()
	if len(creds) != 1 || creds[0] != leaseSecret || leases != 0 {
		t.Fatalf("adapter got credentials %q and %d sealed leases; want the secret and no lease", creds, leases)
	}
	// A run without a lease reaches the adapter without a credential.
	serveWith(h, k.sess, run("r2"))
	if creds, _ := pl.credentials(); creds[1] != "" {
		t.Errorf("a run without a lease got credential %q", creds[1])
	}
}

// S4: one case per refusal reason and per bound field; each fails closed
// with its reason and no provider call.
func TestLeaseRefusalsFailClosed(t *testing.T) {
	type setup struct {
		k    *leaseKit
		h    *Handler
		sess *transport.Session
		req  *wirepb.RunRequest
	}
	cases := []struct {
		name    string
		reason  lease.Reason
		arrange func(t *testing.T, s *setup)
	}{
		{"revoked", lease.Revoked, func(t *testing.T, s *setup) {
			s.k.opener.Apply(&wirepb.CredentialNotice{CredentialRevisions: map[string]uint64{"upstream": 3}})
		}},
		{"disabled profile", lease.Disabled, func(t *testing.T, s *setup) {
			s.k.opener.Apply(&wirepb.CredentialNotice{DisabledProfiles: []string{"hosted"}})
		}},
		{"disabled credential", lease.Disabled, func(t *testing.T, s *setup) {
			s.k.opener.Apply(&wirepb.CredentialNotice{DisabledCredentials: []string{"upstream"}})
		}},
		{"expired", lease.Expired, func(t *testing.T, s *setup) { s.k.now = s.k.now.Add(2 * time.Minute) }},
		{"stale revision", lease.Stale, func(t *testing.T, s *setup) {
			c := s.k.claims("newer")
			c.Revision = 5
			if term := serveWith(s.h, s.sess, leaseRun("newer", s.k.seal(t, c))); term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
				t.Fatalf("the newer lease: %v", term)
			}
		}},
		{"stale generation (another connection)", lease.Stale, func(t *testing.T, s *setup) {
			s.sess = transport.NewSession("node-a", 8, time.Now())
		}},
		{"replayed", lease.Replayed, func(t *testing.T, s *setup) {
			if term := serveWith(s.h, s.sess, leaseRun("first", s.req.GetSealedLease())); term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
				t.Fatalf("first use: %v", term)
			}
		}},
		{"wrong recipient", lease.WrongRecipient, func(t *testing.T, s *setup) {
			b, err := s.k.issuer.Issue(s.k.claims("l"), []byte(leaseSecret), s.k.otherNode)
			if err != nil {
				t.Fatal(err)
			}
			s.req.SealedLease = b
		}},
		{"tampered ciphertext", lease.Malformed, func(t *testing.T, s *setup) {
			s.req.SealedLease[len(s.req.SealedLease)/2] ^= 0x40
		}},
		{"bad signature (another edge key)", lease.Malformed, func(t *testing.T, s *setup) {
			b, err := s.k.otherEdge.Issue(s.k.claims("l"), []byte(leaseSecret), s.k.nodePub)
			if err != nil {
				t.Fatal(err)
			}
			s.req.SealedLease = b
		}},
		{"garbage", lease.Malformed, func(t *testing.T, s *setup) { s.req.SealedLease = []byte("not a lease") }},
		{"mismatched principal", lease.Mismatched, func(t *testing.T, s *setup) { s.req.Binding.Principal = "mallory" }},
		{"mismatched route", lease.Mismatched, func(t *testing.T, s *setup) { s.req.Binding.Route = "other" }},
		{"mismatched slot", lease.Mismatched, func(t *testing.T, s *setup) { s.req.Binding.Slot = "run-2#0" }},
		{"mismatched profile", lease.Mismatched, func(t *testing.T, s *setup) { s.req.Binding.Profile = "cheap" }},
		{"mismatched target", lease.Mismatched, func(t *testing.T, s *setup) {
			c := s.k.claims("l")
			c.Target = "m2" // a lease for another model than the run's
			s.req.SealedLease = s.k.seal(t, c)
		}},
		{"mismatched provider", lease.Mismatched, func(t *testing.T, s *setup) {
			c := s.k.claims("l")
			c.Provider = "q"
			s.req.SealedLease = s.k.seal(t, c)
		}},
		{"mismatched node", lease.Mismatched, func(t *testing.T, s *setup) {
			s.sess = transport.NewSession("node-b", 7, time.Now())
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := newLeaseKit(t)
			pl := okPlugin()
			s := &setup{k: k, h: leaseHandler(t, k, pl, 1), sess: k.sess}
			s.req = leaseRun("r", k.seal(t, k.claims("l")))
			c.arrange(t, s)
			before := pl.calls.Load()
			term := serveWith(s.h, s.sess, s.req)
			f := term.GetFailure()
			if term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_FAILED || f.GetKind() != wirepb.FailureKind_FAILURE_KIND_LEASE_REJECTED || f.GetReason() != string(c.reason) {
				t.Fatalf("terminal = %v, want lease_rejected (%s)", term, c.reason)
			}
			if n := pl.calls.Load() - before; n != 0 {
				t.Fatalf("the provider was called %d times for a refused lease", n)
			}
			if strings.Contains(f.GetMessage(), leaseSecret) {
				t.Fatal("the refusal carries the secret")
			}
			if n := s.h.set.Providers()[0].InUse(); n != 0 {
				t.Errorf("a refused lease left %d slots taken", n)
			}
		})
	}
}

// R11: a run refused for capacity never opens its lease, so the same lease
// opens once a slot is free.
func TestCapacityRefusalDoesNotBurnTheLease(t *testing.T) {
	k := newLeaseKit(t)
	hold, holding := make(chan struct{}), make(chan struct{})
	pl := newFakePlugin(func(_ context.Context, req *wirepb.RunRequest, _ func(*wirepb.RunEvent) error) (*sdk.Result, error) {
		if req.GetRunId() == "busy" {
			close(holding)
			<-hold
		}
		return &sdk.Result{}, nil
	})
	h := leaseHandler(t, k, pl, 1)
	done := make(chan struct{})
	go func() { defer close(done); serveWith(h, k.sess, run("busy")) }()
	<-holding
	sealed := k.seal(t, k.claims("precious"))
	if term := serveWith(h, k.sess, leaseRun("over", sealed)); term.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED {
		t.Fatalf("over capacity: %v", term)
	}
	close(hold)
	<-done
	if term := serveWith(h, k.sess, leaseRun("again", sealed)); term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
		t.Fatalf("the lease refused for capacity did not open afterwards: %v", term)
	}
}

// A Node without a lease opener, or a request on no connection, refuses
// a lease rather than run without its credential.
func TestLeaseWithoutOpenerOrConnectionFailsClosed(t *testing.T) {
	k := newLeaseKit(t)
	pl := okPlugin()
	_, h := onlineSet(t, 1, pl)
	if f := serveWith(h, k.sess, leaseRun("r", k.seal(t, k.claims("a")))).GetFailure(); f.GetReason() != string(lease.Malformed) {
		t.Errorf("no opener: %v", f)
	}
	h.leases = k.opener
	if f := serveWith(h, nil, leaseRun("r", k.seal(t, k.claims("b")))).GetFailure(); f.GetReason() != string(lease.Stale) {
		t.Errorf("no connection: %v", f)
	}
	if pl.calls.Load() != 0 {
		t.Error("the provider was called")
	}
}
