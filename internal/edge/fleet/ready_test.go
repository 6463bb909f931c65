package fleet_test

import (
	"testing"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/quicwire"
)

// R1: only current generations that completed the ready handshake are
// listed as ready; registering, draining, fenced and superseded ones are
// not.
func TestReadyListsOnlyCurrentReadyGenerations(t *testing.T) {
	r := fleet.New(fleet.Options{})
	if got := r.Ready(); len(got) != 0 {
		t.Fatalf("empty registry lists %d ready", len(got))
	}
	ready := func(id string) *fleet.Conn {
		c, _ := register(r, id)
		if err := r.MarkReady(c, c.Generation(), nil); err != nil {
			t.Fatal(err)
		}
		return c
	}
	c3 := ready("n3")
	c1 := ready("n1")
	register(r, "registering")
	r.MarkDraining(ready("draining"))
	r.Fence(ready("fenced"), quicwire.CloseShutdown, "")
	old := ready("n2")
	cur, _ := register(r, "n2") // supersedes old; still registering

	got := r.Ready()
	if len(got) != 2 || got[0] != c1 || got[1] != c3 {
		ids := make([]string, len(got))
		for i, c := range got {
			ids[i] = c.NodeID()
		}
		t.Fatalf("ready %v, want [n1 n3]", ids)
	}
	if err := r.MarkReady(cur, cur.Generation(), nil); err != nil {
		t.Fatal(err)
	}
	got = r.Ready()
	if len(got) != 3 || got[1] != cur || got[1] == old {
		t.Fatalf("after n2's new generation is ready: %d listed, n2 entry is generation %d, want %d", len(got), got[1].Generation(), cur.Generation())
	}
}
