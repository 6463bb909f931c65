package lease_test

import (
	"fmt"
	"testing"

	"github.com/iop-dev/iop/quicwire/lease"
)

func BenchmarkIssue(b *testing.B) {
	iss := lease.NewIssuer(edgeKey)
	c := claims("bench")
	secret := []byte(testSecret)
	for b.Loop() {
		if _, err := iss.Issue(c, secret, &node.pub); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOpen opens distinct leases (an id opens once), cycling through
// a pre-issued pool with a fresh Opener for each pass.
func BenchmarkOpen(b *testing.B) {
	const pool = 1024
	sealed := make([][]byte, pool)
	for i := range sealed {
		sealed[i] = issue(b, claims(fmt.Sprintf("bench-%d", i)))
	}
	clk := newClock(t0)
	want := binding()
	var o *lease.Opener
	i := 0
	for b.Loop() {
		if i%pool == 0 {
			o = newOpener(clk)
		}
		l, err := o.Open(sealed[i%pool], want)
		if err != nil {
			b.Fatal(err)
		}
		l.Wipe()
		i++
	}
}
