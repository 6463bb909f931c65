package lease_test

import (
	"fmt"
	"testing"

	"github.com/iop-dev/iop/quicwire/lease"
)

// BenchmarkIssue issues leases to one Node. "spaced" is a request's wait
// on the Edge (issue 25): the sealing keys made ahead are ready, as
// between requests that do not come back to back; "burst" issues back to
// back, so the keys are mostly made on the way (its CPU is the whole
// cost, with the fill's on the other core).
func BenchmarkIssue(b *testing.B) {
	c := claims("bench")
	secret := []byte(testSecret)
	b.Run("spaced", func(b *testing.B) {
		iss := lease.NewIssuer(edgeKey)
		for b.Loop() {
			b.StopTimer()
			lease.WaitAhead(iss, &node.pub)
			b.StartTimer()
			if _, err := iss.Issue(c, secret, &node.pub); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("burst", func(b *testing.B) {
		iss := lease.NewIssuer(edgeKey)
		for b.Loop() {
			if _, err := iss.Issue(c, secret, &node.pub); err != nil {
				b.Fatal(err)
			}
		}
	})
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
