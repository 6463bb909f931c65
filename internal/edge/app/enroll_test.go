package app

import (
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/pki"
)

// An Edge that issues its own certificate issues a new one at two thirds of
// its lifetime, and presents the same one until then.
func TestTheSelfIssuedEdgeCertificateIsIssuedAgainWhenDue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca, err := pki.NewCA("iop.test", pki.Options{NotBefore: time.Now().Add(-time.Hour), Validity: 10 * 365 * 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		id := quicwire.EdgeIdentity("iop.test", "edge-1")
		s := &selfIssued{ca: ca, id: id, lifetime: 30 * time.Hour, log: slog.New(slog.DiscardHandler)}
		first, err := s.get()
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := quicwire.IdentityFromCert(first.Leaf); got != id || !first.Leaf.NotAfter.After(time.Now().Add(29*time.Hour)) {
			t.Errorf("issued %v until %s", got, first.Leaf.NotAfter)
		}
		time.Sleep(19 * time.Hour)
		if again, _ := s.get(); again != first {
			t.Error("issued again before two thirds of the lifetime")
		}
		time.Sleep(2 * time.Hour)
		if again, _ := s.get(); again == first || again.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) == 0 {
			t.Error("not issued again after two thirds of the lifetime")
		}
	})
}
