package registrar

import (
	"testing"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// FuzzJoinRequest: whatever an unauthenticated peer sends in a join, the
// Edge answers with a refusal and issues nothing, and never panics. The
// one real token is in the corpus with a wrong secret.
func FuzzJoinRequest(f *testing.F) {
	fx := newFixture(f)
	tok, _, err := fx.svc.NewToken("gpu-1", MaxTokenTTL)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tok.ID, make([]byte, 16), []byte{})
	f.Add(tok.ID, []byte("x"), []byte{0x30, 0x82, 0x01, 0x00})
	f.Add("", []byte{}, []byte{})
	f.Add("AAAAAAAA", make([]byte, 64), make([]byte, 300))
	f.Fuzz(func(t *testing.T, id string, secret, csr []byte) {
		resp := fx.svc.join(&wirepb.JoinRequest{TokenId: id, Secret: secret, Csr: csr}, "fuzz")
		if resp.GetRefusal() == wirepb.JoinRefusal_JOIN_REFUSAL_UNSPECIFIED || len(resp.GetChain()) != 0 {
			t.Fatalf("join(%q, %x, %d bytes) was not refused: %v", id, secret, len(csr), resp)
		}
	})
}
