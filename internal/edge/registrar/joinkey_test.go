package registrar

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"strings"
	"testing"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

func csrFor(t *testing.T, key crypto.Signer) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func chainLeaf(t *testing.T, chain [][]byte) *x509.Certificate {
	t.Helper()
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

// Issue 24: a joining Node's key is at least RSA-2048 or ECDSA P-256 (or
// Ed25519). A weaker one is refused as a bad request saying what the key
// is and what is taken, uses no token and issues nothing; renewal holds
// the same line.
func TestWeakJoinKeysAreRefusedSayingWhatIsTaken(t *testing.T) {
	rsa1024, _ := rsa.GenerateKey(rand.Reader, 1024)
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	rsa2048, _ := rsa.GenerateKey(rand.Reader, 2048)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)

	f := newFixture(t)
	for _, tc := range []struct {
		name string
		key  crypto.Signer
		says string // "" when taken
	}{
		{"RSA-1024", rsa1024, "RSA-1024"},
		{"ECDSA P-224", p224, "ECDSA P-224"},
		{"RSA-2048", rsa2048, ""},
		{"ECDSA P-384", p384, ""},
		{"Ed25519", ed, ""},
	} {
		tok, _, _ := f.svc.NewToken("gpu-1", MinTokenTTL*60)
		resp := f.svc.join(&wirepb.JoinRequest{TokenId: tok.ID, Secret: tok.Secret, Csr: csrFor(t, tc.key)}, "test")
		if tc.says == "" {
			if resp.GetRefusal() != 0 {
				t.Errorf("%s: refused: %v %s", tc.name, resp.GetRefusal(), resp.GetRefusalDetail())
			}
			continue
		}
		if resp.GetRefusal() != wirepb.JoinRefusal_JOIN_REFUSAL_BAD_REQUEST || len(resp.GetChain()) != 0 ||
			!strings.Contains(resp.GetRefusalDetail(), tc.says) || !strings.Contains(resp.GetRefusalDetail(), "RSA-2048") {
			t.Errorf("%s: %v %q, want a bad request naming the key and what is taken", tc.name, resp.GetRefusal(), resp.GetRefusalDetail())
		}
		// The token was not used: the same token with a good key joins.
		if again := f.join(tok); again.GetRefusal() != 0 {
			t.Errorf("%s: the token after the refusal: %v %s", tc.name, again.GetRefusal(), again.GetRefusalDetail())
		}
		if _, err := f.svc.Renew("gpu-9", csrFor(t, tc.key)); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: renewal: %v", tc.name, err)
		}
	}
}
