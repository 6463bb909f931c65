package nodeserver_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	nodetransport "github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/pki"
)

// S3: in managed mode the Edge admits only Nodes with a CA-verified
// identity that names the node id they register with; the Node verifies the
// Edge. Each refusal happens before registration, with a clear error on
// both sides.
func TestManagedModeRefusesBadIdentitiesBeforeRegistration(t *testing.T) {
	forEachNetwork(t, func(t *testing.T, h *harness) {
		h.startEdge(0)
		valid := pki.Options{NotBefore: notBefore, Validity: 100 * 365 * 24 * time.Hour}
		foreign, err := pki.NewCA(h.trustDomain, valid)
		if err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name     string
			tls      func() nodetransport.Options
			nodeSays string // in the Node's error
			edgeSays string // in the Edge's log
		}{{
			name: "foreign CA",
			tls: func() nodetransport.Options {
				return nodetransport.Options{TLS: h.nodeTLS("n1", valid, foreign)}
			},
			nodeSays: "refused this Node's certificate",
			edgeSays: "unknown authority",
		}, {
			name: "expired certificate",
			tls: func() nodetransport.Options {
				// Valid for an hour in 1999: expired on every clock here.
				return nodetransport.Options{TLS: h.nodeTLS("n1", pki.Options{NotBefore: notBefore, Validity: time.Hour}, h.ca)}
			},
			nodeSays: "refused this Node's certificate",
			edgeSays: "expired",
		}, {
			name: "node id differs from the certificate",
			tls: func() nodetransport.Options {
				return nodetransport.Options{TLS: h.nodeTLS("someone-else", valid, h.ca)}
			},
			nodeSays: `node id "n1" does not match the certificate identity spiffe://iop.test/node/someone-else`,
			edgeSays: "refused node registration",
		}}
		for _, c := range cases {
			n := h.startNode("n1", func(o *nodetransport.Options) { o.TLS = c.tls().TLS })
			h.waitFor(c.name+": node sees the refusal", 30*time.Second, func() bool { return n.c.Status().LastError != nil })
			n.stop()
			if err := n.c.Status().LastError; !strings.Contains(err.Error(), c.nodeSays) {
				t.Errorf("%s: node error %q, want it to say %q", c.name, err, c.nodeSays)
			}
			if !strings.Contains(h.edgeLog.String(), c.edgeSays) {
				t.Errorf("%s: edge log does not say %q:\n%s", c.name, c.edgeSays, h.edgeLog)
			}
			if v := h.current().reg.Snapshot(); len(v) != 0 {
				t.Fatalf("%s: refused node registered: %+v", c.name, v)
			}
			if n.c.Status().Connects != 0 {
				t.Errorf("%s: node counted a registered connection", c.name)
			}
		}

		// A refusal by the Edge of the mismatched id is an unauthenticated
		// close, which the Node can tell apart.
		n := h.startNode("n1", func(o *nodetransport.Options) { o.TLS = h.nodeTLS("other", valid, h.ca) })
		h.waitFor("refusal", 30*time.Second, func() bool { return n.c.Status().LastError != nil })
		n.stop()
		var ref *nodetransport.RefusedError
		if err := n.c.Status().LastError; !errors.As(err, &ref) || ref.Code != quicwire.CloseUnauthenticated {
			t.Errorf("mismatch refusal: %v, want RefusedError with unauthenticated", err)
		}

		// The Node refuses an Edge whose certificate comes from another CA.
		n = h.startNode("n1", func(o *nodetransport.Options) {
			cert, err := h.ca.IssueTLS(quicwire.NodeIdentity(h.trustDomain, "n1"), valid)
			if err != nil {
				t.Fatal(err)
			}
			o.TLS = quicwire.NodeTLSConfig(foreign.Pool(), cert, h.trustDomain, "", nil)
		})
		h.waitFor("node refuses the edge", 30*time.Second, func() bool { return n.c.Status().LastError != nil })
		n.stop()
		if err := n.c.Status().LastError; !errors.Is(err, quicwire.ErrUnknownAuthority) {
			t.Errorf("node verifying an edge of a foreign CA: %v, want ErrUnknownAuthority", err)
		}

		// And the right identity registers, with its identity recorded.
		h.startNode("n1")
		conn := h.waitReady("n1")
		if v := h.current().reg.Snapshot(); len(v) != 1 || v[0].Identity != "spiffe://iop.test/node/n1" {
			t.Errorf("registered node view %+v, want identity spiffe://iop.test/node/n1", v)
		}
		_ = conn
	}, managed)
}
