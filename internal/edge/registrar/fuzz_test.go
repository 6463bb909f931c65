package registrar

import (
	"encoding/json"
	"testing"

	"github.com/iop-dev/iop/quicwire"
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

// FuzzChangePayload: a notification on the enrollment's channel can come
// from anyone who may NOTIFY on the database, and a removal fences a Node.
// Whatever it holds, parseChange never panics, and what it accepts is one
// of the enrollment's ops on a valid Node id, which it writes back the same.
func FuzzChangePayload(f *testing.F) {
	for _, op := range []string{opRemoved, opRestored, opIssued} {
		b, _ := json.Marshal(change{Op: op, Node: "gpu-1"})
		f.Add(string(b))
	}
	f.Add(`{"op":"removed","node":""}`)
	f.Add(`{"op":"dropped","node":"gpu-1"}`)
	f.Add(`{"op":"removed","node":"../etc"}`)
	f.Add(`{"op":"removed","node":"gpu-1","extra":[1,2,3]}`)
	f.Add(`[]`)
	f.Add(``)
	f.Fuzz(func(t *testing.T, payload string) {
		c, err := parseChange(payload)
		if err != nil {
			return
		}
		if c.Op != opRemoved && c.Op != opRestored && c.Op != opIssued {
			t.Fatalf("accepted op %q", c.Op)
		}
		if quicwire.ValidateID(c.Node) != nil {
			t.Fatalf("accepted node id %q", c.Node)
		}
		b, _ := json.Marshal(c)
		again, err := parseChange(string(b))
		if err != nil || again != c {
			t.Fatalf("%q: written back as %s, read %+v (%v)", payload, b, again, err)
		}
	})
}
