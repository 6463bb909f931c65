package lease_test

import (
	"bytes"
	"crypto/ed25519"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire/lease"
	"github.com/iop-dev/iop/quicwire/lease/leasepb"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// S4: expired, and issued in the future, beyond the skew. Both boundaries
// are inclusive.
func TestOpenRefusesExpiredLeases(t *testing.T) {
	expires := t0.Add(time.Minute)
	for _, tc := range []struct {
		name string
		now  time.Time
		skew time.Duration
		want lease.Reason // "" opens
	}{
		{"while valid", t0.Add(time.Second), 0, ""},
		{"at expiry", expires, 0, ""},
		{"at expiry plus the default skew", expires.Add(lease.DefaultSkew), 0, ""},
		{"a millisecond after expiry plus skew", expires.Add(lease.DefaultSkew + time.Millisecond), 0, lease.Expired},
		{"an hour after expiry", expires.Add(time.Hour), 0, lease.Expired},
		{"issued exactly skew in the future", t0.Add(-lease.DefaultSkew), 0, ""},
		{"issued more than skew in the future", t0.Add(-lease.DefaultSkew - time.Millisecond), 0, lease.Expired},
		{"issued a day in the future", t0.Add(-24 * time.Hour), 0, lease.Expired},
		{"configured skew, inside", expires.Add(30 * time.Second), 30 * time.Second, ""},
		{"configured skew, beyond", expires.Add(30*time.Second + time.Millisecond), 30 * time.Second, lease.Expired},
		{"configured skew, issued inside", t0.Add(-30 * time.Second), 30 * time.Second, ""},
		{"configured skew, issued beyond", t0.Add(-30*time.Second - time.Millisecond), 30 * time.Second, lease.Expired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := lease.NewOpener(lease.OpenerConfig{Key: &node.priv, EdgeKey: edgeKey.Public().(ed25519.PublicKey),
				Now: newClock(tc.now).Now, Skew: tc.skew})
			_, err := o.Open(issue(t, claims("lease-1")), binding())
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				return
			}
			wantRejected(t, err, tc.want)
		})
	}
}

// S4: a disabled profile or credential; the notice is the full current
// state, so a later notice without it enables it again.
func TestOpenRefusesDisabledProfileOrCredential(t *testing.T) {
	for _, tc := range []struct {
		name   string
		notice *wirepb.CredentialNotice
	}{
		{"profile", &wirepb.CredentialNotice{DisabledProfiles: []string{"other", "default"}}},
		{"credential", &wirepb.CredentialNotice{DisabledCredentials: []string{"openai-prod"}}},
		{"both", &wirepb.CredentialNotice{DisabledProfiles: []string{"default"}, DisabledCredentials: []string{"openai-prod"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newOpener(newClock(t0))
			sealed := issue(t, claims("lease-1"))
			o.Apply(tc.notice)
			_, err := o.Open(sealed, binding())
			wantRejected(t, err, lease.Disabled)
			o.Apply(&wirepb.CredentialNotice{DisabledProfiles: []string{"other"}, DisabledCredentials: []string{"openai-dev"}})
			if _, err := o.Open(sealed, binding()); err != nil {
				t.Fatalf("after enabling again: %v", err)
			}
		})
	}
}

// S4: a revision below the revocation revision is revoked; revocation
// revisions only rise.
func TestOpenRefusesRevokedRevisions(t *testing.T) {
	o := newOpener(newClock(t0))
	o.Apply(&wirepb.CredentialNotice{CredentialRevisions: map[string]uint64{"openai-prod": 4, "other": 9}})
	o.Apply(&wirepb.CredentialNotice{CredentialRevisions: map[string]uint64{"openai-prod": 2}}) // lower: ignored
	o.Apply(nil)

	c := claims("rev-3") // revision 3
	_, err := o.Open(issue(t, c), binding())
	wantRejected(t, err, lease.Revoked)

	c = claims("rev-4")
	c.Revision = 4
	if _, err := o.Open(issue(t, c), binding()); err != nil {
		t.Fatalf("revision at the revocation revision: %v", err)
	}
	// Another credential is not affected by openai-prod's revocation.
	c = claims("other-cred")
	c.Credential, c.Revision = "openai-dev", 0
	if _, err := o.Open(issue(t, c), binding()); err != nil {
		t.Fatalf("another credential: %v", err)
	}
}

// S4, R9: a lease of another connection's generation is stale.
func TestOpenRefusesStaleGeneration(t *testing.T) {
	o := newOpener(newClock(t0))
	sealed := issue(t, claims("lease-1")) // generation 7
	for _, gen := range []uint64{6, 8, 0} {
		want := binding()
		want.Generation = gen
		_, err := o.Open(sealed, want)
		wantRejected(t, err, lease.Stale)
	}
}

// S4: a revision older than one already opened for that credential is
// stale; the same revision is not.
func TestOpenRefusesStaleRevision(t *testing.T) {
	o := newOpener(newClock(t0))
	c := claims("rev-5")
	c.Revision = 5
	if _, err := o.Open(issue(t, c), binding()); err != nil {
		t.Fatal(err)
	}
	c = claims("rev-4")
	c.Revision = 4
	_, err := o.Open(issue(t, c), binding())
	wantRejected(t, err, lease.Stale)
	c = claims("rev-5-again")
	c.Revision = 5
	if _, err := o.Open(issue(t, c), binding()); err != nil {
		t.Fatalf("same revision again: %v", err)
	}
	// A refused revision does not raise the highest one.
	c = claims("rev-9-wrong-binding")
	c.Revision, c.Principal = 9, "mallory"
	_, err = o.Open(issue(t, c), binding())
	wantRejected(t, err, lease.Mismatched)
	c = claims("rev-6")
	c.Revision = 6
	if _, err := o.Open(issue(t, c), binding()); err != nil {
		t.Fatalf("after a refused higher revision: %v", err)
	}
}

// S4: a lease opens once.
func TestOpenRefusesReplayedLease(t *testing.T) {
	o := newOpener(newClock(t0))
	sealed := issue(t, claims("lease-1"))
	if _, err := o.Open(sealed, binding()); err != nil {
		t.Fatal(err)
	}
	_, err := o.Open(sealed, binding())
	wantRejected(t, err, lease.Replayed)
	// The same id sealed again (a fresh box) is the same lease.
	_, err = o.Open(issue(t, claims("lease-1")), binding())
	wantRejected(t, err, lease.Replayed)
}

// S4: a lease sealed to another Node's key.
func TestOpenRefusesLeaseSealedToAnotherKey(t *testing.T) {
	sealed, err := lease.NewIssuer(edgeKey).Issue(claims("lease-1"), []byte(testSecret), &otherNode.pub)
	if err != nil {
		t.Fatal(err)
	}
	_, err = newOpener(newClock(t0)).Open(sealed, binding())
	wantRejected(t, err, lease.WrongRecipient)

	// The other Node opens it: the refusal was about the key, nothing else.
	other := lease.NewOpener(lease.OpenerConfig{Key: &otherNode.priv, Public: &otherNode.pub,
		EdgeKey: edgeKey.Public().(ed25519.PublicKey), Now: newClock(t0).Now})
	if _, err := other.Open(sealed, binding()); err != nil {
		t.Fatalf("the recipient: %v", err)
	}
}

// S4: a flipped byte anywhere is refused: the version byte and the box as
// malformed, the key id as wrong_recipient. Nothing opens.
func TestOpenRefusesEveryTamperedByte(t *testing.T) {
	sealed := issue(t, claims("lease-1"))
	o := newOpener(newClock(t0))
	for i := range sealed {
		for _, mask := range []byte{0x01, 0x80} {
			tampered := bytes.Clone(sealed)
			tampered[i] ^= mask
			want := lease.Malformed
			if i >= 1 && i < 1+lease.KeyIDSize {
				want = lease.WrongRecipient
			}
			_, err := o.Open(tampered, binding())
			if err == nil {
				t.Fatalf("byte %d ^ %#x: opened", i, mask)
			}
			if r, _ := lease.ReasonOf(err); r != want {
				t.Fatalf("byte %d ^ %#x: %v, want %s", i, mask, err, want)
			}
		}
	}
	// None was burned: the original still opens.
	if _, err := o.Open(sealed, binding()); err != nil {
		t.Fatalf("the original after tampered copies: %v", err)
	}
}

// S4: anything but the Edge's signature over this lease for this Node's
// key is refused as malformed.
func TestOpenRefusesBadSignatures(t *testing.T) {
	valid := validProto()
	payload, err := proto.Marshal(valid)
	if err != nil {
		t.Fatal(err)
	}
	tamperedPayload := bytes.Clone(payload)
	tamperedPayload[bytes.Index(tamperedPayload, []byte("alice"))] = 'A'
	good := signPayload(payload, edgeKey, &node.pub)

	for _, tc := range []struct {
		name   string
		signed *leasepb.Signed
		opens  bool
	}{
		{"control: signed by the Edge for this Node", good, true},
		{"signed by another key", signPayload(payload, otherEdgeKey, &node.pub), false},
		{"payload changed after signing", &leasepb.Signed{Payload: tamperedPayload, Signature: good.Signature}, false},
		{"signed for another Node's key, re-sealed to this one", signPayload(payload, edgeKey, &otherNode.pub), false},
		{"signed without the domain", &leasepb.Signed{Payload: payload,
			Signature: ed25519.Sign(edgeKey, append(node.pub[:], payload...))}, false},
		{"signed over the payload alone", &leasepb.Signed{Payload: payload, Signature: ed25519.Sign(edgeKey, payload)}, false},
		{"signature cut short", &leasepb.Signed{Payload: payload, Signature: good.Signature[:63]}, false},
		{"signature too long", &leasepb.Signed{Payload: payload, Signature: append(bytes.Clone(good.Signature), 0)}, false},
		{"no signature", &leasepb.Signed{Payload: payload}, false},
		{"zero signature", &leasepb.Signed{Payload: payload, Signature: make([]byte, 64)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newOpener(newClock(t0)).Open(sealRaw(t, tc.signed, &node.pub), binding())
			if tc.opens {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				return
			}
			wantRejected(t, err, lease.Malformed)
		})
	}
}

// Until the Edge's key is known nothing opens; a new key replaces the old.
func TestOpenNeedsTheCurrentEdgeKey(t *testing.T) {
	o := lease.NewOpener(lease.OpenerConfig{Key: &node.priv, Now: newClock(t0).Now})
	sealed := issue(t, claims("lease-1"))
	_, err := o.Open(sealed, binding())
	wantRejected(t, err, lease.Malformed)

	o.SetEdgeKey(ed25519.PublicKey{1, 2, 3}) // not a key: still none
	_, err = o.Open(sealed, binding())
	wantRejected(t, err, lease.Malformed)

	o.SetEdgeKey(otherEdgeKey.Public().(ed25519.PublicKey))
	_, err = o.Open(sealed, binding())
	wantRejected(t, err, lease.Malformed)

	key := edgeKey.Public().(ed25519.PublicKey)
	o.SetEdgeKey(key)
	clear(key) // the Opener keeps its own copy
	if _, err := o.Open(sealed, binding()); err != nil {
		t.Fatalf("with the Edge's key: %v", err)
	}
}

// S4: malformed input of every kind is refused as malformed.
func TestOpenRefusesMalformedInput(t *testing.T) {
	sealed := issue(t, claims("lease-1"))
	signedRaw := func(edit func(*leasepb.Lease)) []byte {
		pb := validProto()
		edit(pb)
		return sealRaw(t, signRaw(t, pb, edgeKey, &node.pub), &node.pub)
	}
	// A correctly signed payload that is not a valid Lease.
	signedPayload := func(payload []byte) []byte {
		return sealRaw(t, signPayload(payload, edgeKey, &node.pub), &node.pub)
	}
	validPayload, _ := proto.Marshal(validProto())
	withUnknown := protowire.AppendTag(bytes.Clone(validPayload), 99, protowire.VarintType)
	withUnknown = protowire.AppendVarint(withUnknown, 1)
	badUTF8 := protowire.AppendTag(bytes.Clone(validPayload), 2, protowire.BytesType) // principal
	badUTF8 = protowire.AppendBytes(badUTF8, []byte{0xff, 0xfe})
	signedBytes, _ := proto.Marshal(signPayload(validPayload, edgeKey, &node.pub))
	signedWithUnknown := protowire.AppendTag(bytes.Clone(signedBytes), 3, protowire.BytesType)
	signedWithUnknown = protowire.AppendBytes(signedWithUnknown, []byte("x"))

	for _, tc := range []struct {
		name   string
		sealed []byte
	}{
		{"nil", nil},
		{"empty", []byte{}},
		{"one byte", []byte{1}},
		{"header only", sealed[:1+lease.KeyIDSize]},
		{"cut inside the box", sealed[:len(sealed)-1]},
		{"cut to the box's overhead", sealed[:1+lease.KeyIDSize+48]},
		{"extra byte after the box", append(bytes.Clone(sealed), 0)},
		{"over the size limit", append(bytes.Clone(sealed), make([]byte, lease.MaxSealedSize)...)},
		{"version 0", append([]byte{0}, sealed[1:]...)},
		{"version 2", append([]byte{2}, sealed[1:]...)},
		{"content is not a Signed", sealBytes(t, []byte{0xff, 0xff, 0xff}, &node.pub)},
		{"content is empty", sealBytes(t, nil, &node.pub)},
		{"Signed has an unknown field", sealBytes(t, signedWithUnknown, &node.pub)},
		{"payload is not a Lease", signedPayload([]byte{0x0a, 0x7f})},
		{"payload is empty", signedPayload(nil)},
		{"Lease has an unknown field", signedPayload(withUnknown)},
		{"Lease has invalid UTF-8", signedPayload(badUTF8)},
		{"no lease id", signedRaw(func(l *leasepb.Lease) { l.LeaseId = "" })},
		{"lease id too long", signedRaw(func(l *leasepb.Lease) { l.LeaseId = strings.Repeat("i", lease.MaxIDSize+1) })},
		{"no node id", signedRaw(func(l *leasepb.Lease) { l.NodeId = "" })},
		{"no provider", signedRaw(func(l *leasepb.Lease) { l.Provider = "" })},
		{"no credential", signedRaw(func(l *leasepb.Lease) { l.Credential = "" })},
		{"generation 0", signedRaw(func(l *leasepb.Lease) { l.Generation = 0 })},
		{"no issue time", signedRaw(func(l *leasepb.Lease) { l.IssuedUnixMs = 0 })},
		{"negative issue time", signedRaw(func(l *leasepb.Lease) { l.IssuedUnixMs = -5 })},
		{"no expiry", signedRaw(func(l *leasepb.Lease) { l.ExpiresUnixMs = 0 })},
		{"expires before issue", signedRaw(func(l *leasepb.Lease) { l.ExpiresUnixMs = l.IssuedUnixMs - 1 })},
		{"lives too long", signedRaw(func(l *leasepb.Lease) { l.ExpiresUnixMs = l.IssuedUnixMs + lease.MaxLifetime.Milliseconds() + 1 })},
		{"no secret", signedRaw(func(l *leasepb.Lease) { l.Secret = nil })},
		{"secret too large", signedRaw(func(l *leasepb.Lease) { l.Secret = make([]byte, lease.MaxSecretSize+1) })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newOpener(newClock(t0)).Open(tc.sealed, binding())
			wantRejected(t, err, lease.Malformed)
		})
	}
}

// S4, R11: every bound field must equal the dispatch's; the detail names
// the field but not its value.
func TestOpenRefusesAMismatchOfEachBoundField(t *testing.T) {
	for _, tc := range []struct {
		field string
		edit  func(*lease.Binding)
	}{
		{"principal", func(b *lease.Binding) { b.Principal = "mallory" }},
		{"route", func(b *lease.Binding) { b.Route = "embeddings" }},
		{"slot", func(b *lease.Binding) { b.Slot = "slot-2" }},
		{"profile", func(b *lease.Binding) { b.Profile = "premium" }},
		{"target", func(b *lease.Binding) { b.Target = "llama3:70b" }},
		{"provider", func(b *lease.Binding) { b.Provider = "openai-2" }},
		{"node_id", func(b *lease.Binding) { b.NodeID = "node-b" }},
		{"principal", func(b *lease.Binding) { b.Principal = "" }},
		{"principal", func(b *lease.Binding) { b.Principal = "alice " }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			o := newOpener(newClock(t0))
			sealed := issue(t, claims("lease-1"))
			want := binding()
			tc.edit(&want)
			_, err := o.Open(sealed, want)
			wantRejected(t, err, lease.Mismatched)
			if !strings.HasSuffix(err.Error(), "in "+tc.field) {
				t.Fatalf("detail does not name the field: %v", err)
			}
			for _, v := range []string{"mallory", "embeddings", "slot-2", "premium", "70b", "openai-2", "node-b", "alice"} {
				if strings.Contains(err.Error(), v) {
					t.Fatalf("detail shows a value: %v", err)
				}
			}
		})
	}
	t.Run("several", func(t *testing.T) {
		want := binding()
		want.Route, want.NodeID = "x", "y"
		_, err := newOpener(newClock(t0)).Open(issue(t, claims("lease-1")), want)
		wantRejected(t, err, lease.Mismatched)
		if !strings.HasSuffix(err.Error(), "in route, node_id") {
			t.Fatalf("detail: %v", err)
		}
	})
}

// A refused lease is not burned: once the cause is gone it opens (once).
func TestRefusedLeaseDoesNotEnterTheReplayCache(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reason lease.Reason
		break_ func(o *lease.Opener, clk *clock, want *lease.Binding)
		fix    func(o *lease.Opener, clk *clock, want *lease.Binding)
	}{
		{"mismatched binding", lease.Mismatched,
			func(_ *lease.Opener, _ *clock, w *lease.Binding) { w.Slot = "slot-9" },
			func(_ *lease.Opener, _ *clock, w *lease.Binding) { *w = binding() }},
		{"stale generation", lease.Stale,
			func(_ *lease.Opener, _ *clock, w *lease.Binding) { w.Generation = 8 },
			func(_ *lease.Opener, _ *clock, w *lease.Binding) { *w = binding() }},
		{"disabled profile", lease.Disabled,
			func(o *lease.Opener, _ *clock, _ *lease.Binding) {
				o.Apply(&wirepb.CredentialNotice{DisabledProfiles: []string{"default"}})
			},
			func(o *lease.Opener, _ *clock, _ *lease.Binding) { o.Apply(&wirepb.CredentialNotice{}) }},
		{"issued in the future", lease.Expired,
			func(_ *lease.Opener, clk *clock, _ *lease.Binding) { clk.Set(t0.Add(-time.Minute)) },
			func(_ *lease.Opener, clk *clock, _ *lease.Binding) { clk.Set(t0) }},
		{"no Edge key", lease.Malformed,
			func(o *lease.Opener, _ *clock, _ *lease.Binding) { o.SetEdgeKey(nil) },
			func(o *lease.Opener, _ *clock, _ *lease.Binding) { o.SetEdgeKey(edgeKey.Public().(ed25519.PublicKey)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock(t0)
			o := newOpener(clk)
			sealed := issue(t, claims("lease-1"))
			want := binding()
			tc.break_(o, clk, &want)
			for range 3 {
				_, err := o.Open(sealed, want)
				wantRejected(t, err, tc.reason)
			}
			if n := o.Len(); n != 0 {
				t.Fatalf("replay cache holds %d ids after refusals", n)
			}
			tc.fix(o, clk, &want)
			if _, err := o.Open(sealed, want); err != nil {
				t.Fatalf("after the fix: %v", err)
			}
			_, err := o.Open(sealed, want)
			wantRejected(t, err, lease.Replayed)
		})
	}
}

// The checks run in the documented order: the first failure is reported.
func TestOpenReportsTheFirstFailedCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		want lease.Reason
		edit func(c *lease.Claims, b *lease.Binding, n *wirepb.CredentialNotice, replay *bool)
	}{
		{"expired before disabled", lease.Expired, func(c *lease.Claims, _ *lease.Binding, n *wirepb.CredentialNotice, _ *bool) {
			c.IssuedAt, c.ExpiresAt = t0.Add(-time.Hour), t0.Add(-time.Minute)
			n.DisabledProfiles = []string{"default"}
		}},
		{"disabled before revoked", lease.Disabled, func(_ *lease.Claims, _ *lease.Binding, n *wirepb.CredentialNotice, _ *bool) {
			n.DisabledCredentials = []string{"openai-prod"}
			n.CredentialRevisions = map[string]uint64{"openai-prod": 10}
		}},
		{"revoked before stale", lease.Revoked, func(_ *lease.Claims, b *lease.Binding, n *wirepb.CredentialNotice, _ *bool) {
			n.CredentialRevisions = map[string]uint64{"openai-prod": 10}
			b.Generation = 99
		}},
		{"stale before mismatched", lease.Stale, func(_ *lease.Claims, b *lease.Binding, _ *wirepb.CredentialNotice, _ *bool) {
			b.Generation, b.Principal = 99, "bob"
		}},
		{"mismatched before replayed", lease.Mismatched, func(_ *lease.Claims, b *lease.Binding, _ *wirepb.CredentialNotice, replay *bool) {
			b.Principal = "bob"
			*replay = true
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, want, notice, replay := claims("lease-1"), binding(), &wirepb.CredentialNotice{}, false
			tc.edit(&c, &want, notice, &replay)
			sealed := issue(t, c)
			o := newOpener(newClock(t0))
			if replay {
				if _, err := o.Open(sealed, binding()); err != nil {
					t.Fatal(err)
				}
			}
			o.Apply(notice)
			_, err := o.Open(sealed, want)
			wantRejected(t, err, tc.want)
		})
	}
}
