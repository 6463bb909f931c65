package lease_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/nacl/box"
	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire/lease"
	"github.com/iop-dev/iop/quicwire/lease/leasepb"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite testdata/fuzz/FuzzOpen from fuzzSeeds")

// fuzzNow is the clock of FuzzOpen's Opener: the valid seeds are live.
var fuzzNow = t0.Add(time.Second)

type fuzzSeed struct {
	name   string // <reason>_... or valid_...: what Open says of it
	sealed []byte
}

// fuzzSeeds are valid and broken leases made from the deterministic test
// keys and a fixed sealing randomness, so they come out byte for byte the
// same each time.
func fuzzSeeds(t testing.TB) []fuzzSeed {
	t.Helper()
	seal := func(name string, key ed25519.PrivateKey, c lease.Claims, recipient *[32]byte) []byte {
		r := rand.NewChaCha8([32]byte(seed("fuzz seed " + name)))
		sealed, err := lease.NewIssuerWithRand(key, r).Issue(c, []byte(testSecret), recipient)
		if err != nil {
			t.Fatalf("seed %s: %v", name, err)
		}
		return sealed
	}
	valid := seal("valid_lease", edgeKey, claims("seed-valid"), &node.pub)
	other := claims("seed-valid-other")
	other.Revision = 0
	expired := claims("seed-expired")
	expired.IssuedAt, expired.ExpiresAt = t0.Add(-10*time.Minute), t0.Add(-5*time.Minute)
	mismatched := claims("seed-mismatched")
	mismatched.Principal = "mallory"
	stale := claims("seed-stale")
	stale.Generation = 6
	flip := func(b []byte, i int) []byte {
		b = bytes.Clone(b)
		b[i] ^= 0x01
		return b
	}
	return []fuzzSeed{
		{"valid_lease", valid},
		{"valid_lease_revision_0", seal("valid_lease_revision_0", edgeKey, other, &node.pub)},
		{"expired_lease", seal("expired_lease", edgeKey, expired, &node.pub)},
		{"mismatched_principal", seal("mismatched_principal", edgeKey, mismatched, &node.pub)},
		{"stale_generation", seal("stale_generation", edgeKey, stale, &node.pub)},
		{"wrong_recipient_another_node", seal("wrong_recipient_another_node", edgeKey, claims("seed-other-node"), &otherNode.pub)},
		{"malformed_signed_by_another_key", seal("malformed_signed_by_another_key", otherEdgeKey, claims("seed-forged"), &node.pub)},
		{"malformed_tampered_box", flip(valid, len(valid)-1)},
		{"malformed_tampered_ephemeral_key", flip(valid, 1+lease.KeyIDSize)},
		{"malformed_version_2", append([]byte{2}, valid[1:]...)},
		{"malformed_truncated", valid[:40]},
		{"malformed_empty", []byte{}},
	}
}

// FuzzOpen feeds arbitrary bytes to Open as a sealed lease. Open never
// panics, refuses with a *RejectedError of a documented reason that never
// shows the secret, and accepts only what an independent reading of the
// format (the package doc) verifies as the Edge's lease for this Node and
// this dispatch; an accepted lease is burned.
//
// Committed seeds live in testdata/fuzz/FuzzOpen (go test -run
// TestFuzzSeedCorpus -update-seeds rewrites them).
func FuzzOpen(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s.sealed)
	}
	f.Fuzz(func(t *testing.T, sealed []byte) {
		o := newOpener(newClock(fuzzNow))
		l, err := o.Open(sealed, binding())
		if err != nil {
			var re *lease.RejectedError
			if !errors.As(err, &re) || !re.Reason.Valid() {
				t.Fatalf("error %v (%T) is not a *RejectedError with a valid reason", err, err)
			}
			if strings.Contains(err.Error(), testSecret) {
				t.Fatalf("error shows the secret: %v", err)
			}
			return
		}
		verifyIndependently(t, sealed, l)
		_, err = o.Open(sealed, binding())
		wantRejected(t, err, lease.Replayed)
	})
}

// verifyIndependently reads sealed by the package doc alone and fails
// unless it is a lease the Edge signed for this Node's key, bound to
// binding(), live at fuzzNow, and equal to what Open returned.
func verifyIndependently(t *testing.T, sealed []byte, l *lease.Lease) {
	t.Helper()
	kid := sha256.Sum256(node.pub[:])
	if len(sealed) > lease.MaxSealedSize || sealed[0] != 1 || !bytes.Equal(sealed[1:9], kid[:8]) {
		t.Fatalf("accepted a lease with a bad header: % x", sealed[:min(len(sealed), 9)])
	}
	plain, ok := box.OpenAnonymous(nil, sealed[9:], &node.pub, &node.priv)
	if !ok {
		t.Fatal("accepted a box that does not open")
	}
	var s leasepb.Signed
	if err := proto.Unmarshal(plain, &s); err != nil {
		t.Fatalf("accepted an unparsable Signed: %v", err)
	}
	if !ed25519.Verify(edgeKey.Public().(ed25519.PublicKey), signedMessage(&node.pub, s.Payload), s.Signature) {
		t.Fatal("accepted a lease the Edge did not sign for this Node")
	}
	var pb leasepb.Lease
	if err := proto.Unmarshal(s.Payload, &pb); err != nil {
		t.Fatalf("accepted an unparsable Lease: %v", err)
	}
	b := binding()
	got := lease.Binding{Principal: pb.Principal, Route: pb.Route, Slot: pb.Slot, Profile: pb.Profile, Target: pb.Target,
		Provider: pb.Provider, NodeID: pb.NodeId, Generation: pb.Generation}
	if got != b || l.Binding != b {
		t.Fatalf("accepted a lease bound to %+v (returned %+v), dispatch %+v", got, l.Binding, b)
	}
	issued, expires := time.UnixMilli(pb.IssuedUnixMs), time.UnixMilli(pb.ExpiresUnixMs)
	if fuzzNow.After(expires.Add(lease.DefaultSkew)) || issued.After(fuzzNow.Add(lease.DefaultSkew)) {
		t.Fatalf("accepted a lease valid from %s to %s at %s", issued, expires, fuzzNow)
	}
	if pb.LeaseId == "" || l.ID != pb.LeaseId || l.Credential != pb.Credential || l.Revision != pb.CredentialRevision ||
		!l.IssuedAt.Equal(issued) || !l.ExpiresAt.Equal(expires) || !bytes.Equal(l.Secret, pb.Secret) || len(pb.Secret) == 0 {
		t.Fatalf("Open returned %v, the lease says %v", l, &pb)
	}
}

// The committed seeds are named after what Open says of them; check that
// it does, so a seed meant to be valid is not silently broken.
func TestFuzzSeedCorpusIsWhatItsNamesSay(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzOpen")
	if *updateSeeds {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, s := range fuzzSeeds(t) {
			if err := os.WriteFile(filepath.Join(dir, s.name), fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", s.sealed), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	paths, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	committed := map[string]bool{}
	for _, p := range paths {
		committed[filepath.Base(p)] = true
	}
	for _, s := range fuzzSeeds(t) {
		if !committed[s.name] {
			t.Errorf("seed %s is not committed: go test ./quicwire/lease -run TestFuzzSeedCorpus -update-seeds", s.name)
		}
	}
	reasons := []lease.Reason{lease.Revoked, lease.Disabled, lease.Expired, lease.Stale, lease.Replayed,
		lease.WrongRecipient, lease.Mismatched, lease.Malformed}
	for _, p := range paths {
		name := filepath.Base(p)
		t.Run(name, func(t *testing.T) {
			sealed := readSeed(t, p)
			var want lease.Reason
			for _, r := range reasons {
				if strings.HasPrefix(name, string(r)+"_") {
					want = r
				}
			}
			if want == "" && !strings.HasPrefix(name, "valid_") {
				t.Fatalf("seed name %q does not say what it holds (valid_ or <reason>_)", name)
			}
			l, err := newOpener(newClock(fuzzNow)).Open(sealed, binding())
			if want == "" {
				if err != nil {
					t.Fatalf("a valid seed: %v", err)
				}
				l.Wipe()
				return
			}
			wantRejected(t, err, want)
		})
	}
}

// readSeed parses a "go test fuzz v1" file of FuzzOpen.
func readSeed(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 || lines[0] != "go test fuzz v1" {
		t.Fatalf("%s: not a go test fuzz v1 file with one value", path)
	}
	data, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return []byte(data)
}
