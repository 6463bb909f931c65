package nodeserver_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/edge/fleet"
	nodetransport "github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/internal/node/nodecert"
	"github.com/iop-dev/iop/quicwire"
	wireenroll "github.com/iop-dev/iop/quicwire/enroll"
	"github.com/iop-dev/iop/quicwire/pki"
)

// enrolling switches a managed harness to an Edge that issues Node
// identities, with certificates of lifetime.
func enrolling(lifetime time.Duration) harnessOpt {
	return func(h *harness) {
		managed(h)
		h.enrollDir, h.certLifetime = h.t.TempDir(), lifetime
	}
}

// join redeems tok at the harness's Edge over its network and writes what
// a Node needs into dir, as noded join does; it returns the Node's
// certificate holder.
func (h *harness) join(tok wireenroll.Token, dir string) (*nodecert.Holder, error) {
	h.t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		h.t.Fatal(err)
	}
	tr := &quic.Transport{Conn: h.packetConn()}
	defer tr.Close()
	j, err := wireenroll.Join(context.Background(), tr, h.edgeAddr, tok, csr, "test")
	if err != nil {
		return nil, err
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			h.t.Fatal(err)
		}
		return p
	}
	holder, _, err := nodecert.Load(write("ca.pem", "CERTIFICATE", j.CA.Raw), write("node.pem", "CERTIFICATE", j.Cert.Raw),
		write("node-key.pem", "PRIVATE KEY", keyDER), quicwire.NodeIdentity(j.TrustDomain, j.NodeID))
	if err != nil {
		h.t.Fatal(err)
	}
	return holder, nil
}

// withCertificates makes the Node present and renew holder's certificate.
func withCertificates(holder *nodecert.Holder) nodeOpt {
	return func(o *nodetransport.Options) {
		o.TLS = holder.TLSConfig("iop.test", "")
		o.Certificates = holder
	}
}

// P5, S3: a token joins once over the Edge's own port (ALPN iop-join/1,
// no client certificate), a token of another CA is refused by the Node
// before it sends anything, and the joined Node registers with its
// identity.
func TestAJoinedNodeRegistersWithItsIdentity(t *testing.T) {
	forEachNetwork(t, func(t *testing.T, h *harness) {
		e := h.startEdge(0)
		tok, _, err := e.enrolled.NewToken("n1", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		holder, err := h.join(tok, t.TempDir())
		if err != nil {
			t.Fatalf("join: %v", err)
		}
		if _, err := h.join(tok, t.TempDir()); !errors.Is(err, wireenroll.ErrTokenUsed) {
			t.Errorf("second join: %v, want ErrTokenUsed", err)
		}
		foreign := tok
		other, _ := pki.NewCA("iop.test", pki.Options{NotBefore: notBefore, Validity: 100 * 365 * 24 * time.Hour})
		foreign.CAHash = wireenroll.CAHash(other.Cert)
		if _, err := h.join(foreign, t.TempDir()); !errors.Is(err, wireenroll.ErrForeignEdge) {
			t.Errorf("foreign token: %v, want ErrForeignEdge", err)
		}
		h.startNode("n1", withCertificates(holder))
		c := h.waitReady("n1")
		if c.Identity() != "spiffe://iop.test/node/n1" {
			t.Errorf("identity %q", c.Identity())
		}
	}, enrolling(time.Hour))
}

// P5: the Node renews at two thirds of its certificate's lifetime on the
// control stream of its connection, which goes on (same generation); the
// certificate file holds the new one. After `node remove` the Edge fences
// the connection at once and refuses the reconnect. Fake time: a day of
// certificates in a moment.
func TestCertificatesRenewOnTheConnectionAndRevocationFences(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHarness(t, enrolling(time.Hour))
		e := h.startEdge(0)
		tok, _, _ := e.enrolled.NewToken("n1", time.Hour)
		dir := t.TempDir()
		holder, err := h.join(tok, dir)
		if err != nil {
			t.Fatal(err)
		}
		n := h.startNode("n1", withCertificates(holder))
		first := h.waitReady("n1")
		serial0 := holder.Current().Leaf.SerialNumber
		nb, na := holder.Validity()

		time.Sleep(time.Until(nb.Add(na.Sub(nb)*2/3)) - time.Second)
		synctest.Wait()
		if holder.Current().Leaf.SerialNumber.Cmp(serial0) != 0 {
			t.Fatal("renewed before two thirds of the lifetime")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		renewed := holder.Current().Leaf
		if renewed.SerialNumber.Cmp(serial0) == 0 {
			t.Fatalf("not renewed at two thirds of the lifetime:\n%s", n.log)
		}
		if c, _ := e.reg.Current("n1"); c != first || c.State() != fleet.Ready {
			t.Errorf("the connection changed with the renewal: %v", c.State())
		}
		onDisk, _ := os.ReadFile(filepath.Join(dir, "node.pem"))
		if block, _ := pem.Decode(onDisk); block == nil || !bytes.Equal(block.Bytes, renewed.Raw) {
			t.Error("node.pem does not hold the renewed certificate")
		}
		// Renewal goes on: three more in two hours.
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		if got := holder.Current().Leaf; !got.NotAfter.After(renewed.NotAfter.Add(time.Hour)) {
			t.Errorf("renewals stopped: certificate valid until %s", got.NotAfter)
		}

		if _, fenced, err := e.enrolled.Remove("n1"); err != nil || !fenced {
			t.Fatalf("remove: fenced=%v err=%v", fenced, err)
		}
		if code, _, _ := first.FenceReason(); first.State() != fleet.Fenced || code != quicwire.CloseUnauthenticated {
			t.Errorf("after remove: %s %s", first.State(), code)
		}
		h.waitFor("the reconnect refused", time.Minute, func() bool {
			var ref *nodetransport.RefusedError
			return errors.As(n.c.Status().LastError, &ref) && ref.Code == quicwire.CloseUnauthenticated &&
				strings.Contains(ref.Reason, "was removed")
		})
		if c, _ := e.reg.Current("n1"); c != first {
			t.Error("the removed Node registered again")
		}
	})
}
