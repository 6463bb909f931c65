// Package tlscli adds the `edged tls` commands that bootstrap managed mode
// (S3): create the deployment's CA, then issue one certificate per Edge and
// per Node, in the manner of `nomad tls` and `consul tls`. The commands only
// write files; the daemons read them through their own flags.
package tlscli

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/pki"
)

// File names of the CA: what `tls ca create` writes and what
// `tls cert create` reads unless told otherwise.
const (
	CAFile    = "iop-ca.pem"
	CAKeyFile = "iop-ca-key.pem"
)

// cli holds the parsed flags of the tls commands.
type cli struct {
	out io.Writer

	caTrustDomain string
	caOutDir      string
	caDays        int

	node, edge string
	ca, caKey  string
	dnsNames   []string
	ips        []net.IP
	certDays   int
	certOutDir string
}

// Register adds `tls ca create` and `tls cert create` to app; their
// reports go to out.
func Register(app *kingpin.Application, out io.Writer) {
	c := &cli{out: out}
	tls := app.Command("tls", "Create the CA and certificates of managed mode (mutual TLS between Edge and Nodes).")

	caCreate := tls.Command("ca", "Manage the certificate authority.").
		Command("create", "Create a CA: "+CAFile+" (give to every Edge and Node) and "+CAKeyFile+" (keep secret).")
	caCreate.Flag("trust-domain", "Trust domain named in every identity, spiffe://TRUST-DOMAIN/...").
		Default("iop.local").StringVar(&c.caTrustDomain)
	caCreate.Flag("out-dir", "Directory to write the files to.").Default(".").StringVar(&c.caOutDir)
	caCreate.Flag("days", "Validity of the CA in days.").Default("1825").IntVar(&c.caDays)
	caCreate.Action(func(*kingpin.ParseContext) error { return c.createCA() })

	certCreate := tls.Command("cert", "Manage Edge and Node certificates.").
		Command("create", "Issue a certificate naming one Edge or one Node (exactly one of --node, --edge).")
	certCreate.Flag("node", "Issue for the Node with this id.").PlaceHolder("ID").StringVar(&c.node)
	certCreate.Flag("edge", "Issue for the Edge with this id.").PlaceHolder("ID").StringVar(&c.edge)
	certCreate.Flag("ca", "CA certificate.").Default(CAFile).StringVar(&c.ca)
	certCreate.Flag("ca-key", "CA private key.").Default(CAKeyFile).StringVar(&c.caKey)
	certCreate.Flag("dns", "Extra DNS SAN (repeatable). Not needed by IOP, which verifies identities, not names.").PlaceHolder("NAME").StringsVar(&c.dnsNames)
	certCreate.Flag("ip", "Extra IP SAN (repeatable).").PlaceHolder("IP").IPListVar(&c.ips)
	certCreate.Flag("days", "Validity of the certificate in days (capped at the CA's expiry).").Default("365").IntVar(&c.certDays)
	certCreate.Flag("out-dir", "Directory to write the files to.").Default(".").StringVar(&c.certOutDir)
	certCreate.Action(func(*kingpin.ParseContext) error { return c.createCert() })
}

func days(n int) (time.Duration, error) {
	if n <= 0 {
		return 0, fmt.Errorf("--days must be positive, got %d", n)
	}
	return time.Duration(n) * 24 * time.Hour, nil
}

func (c *cli) createCA() error {
	validity, err := days(c.caDays)
	if err != nil {
		return err
	}
	ca, err := pki.NewCA(c.caTrustDomain, pki.Options{Validity: validity})
	if err != nil {
		return err
	}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	certFile, keyFile := filepath.Join(c.caOutDir, CAFile), filepath.Join(c.caOutDir, CAKeyFile)
	if err := pki.WriteFiles(certFile, ca.CertPEM(), keyFile, keyPEM); err != nil {
		return err
	}
	fmt.Fprintf(c.out, "==> CA for trust domain %s, valid until %s\n", ca.TrustDomain, ca.Cert.NotAfter.UTC().Format(time.DateOnly))
	fmt.Fprintf(c.out, "==> Wrote CA certificate %s (give it to the Edge and every Node)\n", certFile)
	fmt.Fprintf(c.out, "==> Wrote CA key %s (keep it secret: it can mint any identity)\n", keyFile)
	fmt.Fprintf(c.out, "Next: issue certificates with\n  edged tls cert create --edge=ID --ca=%s --ca-key=%s\n  edged tls cert create --node=ID --ca=%s --ca-key=%s\n",
		certFile, keyFile, certFile, keyFile)
	return nil
}

func (c *cli) createCert() error {
	if (c.node == "") == (c.edge == "") {
		return errors.New("give exactly one of --node=ID or --edge=ID")
	}
	kind, id := quicwire.KindNode, c.node
	if c.edge != "" {
		kind, id = quicwire.KindEdge, c.edge
	}
	if err := quicwire.ValidateID(id); err != nil {
		return fmt.Errorf("--%s: %w", kind, err)
	}
	validity, err := days(c.certDays)
	if err != nil {
		return err
	}
	ca, err := pki.LoadCA(c.ca, c.caKey)
	if err != nil {
		return err
	}
	ident := quicwire.Identity{TrustDomain: ca.TrustDomain, Kind: kind, ID: id}
	certPEM, keyPEM, err := ca.Issue(ident, pki.Options{Validity: validity, DNSNames: c.dnsNames, IPAddresses: c.ips})
	if err != nil {
		return err
	}
	certFile := filepath.Join(c.certOutDir, kind+"-"+id+".pem")
	keyFile := filepath.Join(c.certOutDir, kind+"-"+id+"-key.pem")
	if err := pki.WriteFiles(certFile, certPEM, keyFile, keyPEM); err != nil {
		return err
	}
	fmt.Fprintf(c.out, "==> Issued identity %s, valid until %s\n", ident, validUntil(certPEM))
	fmt.Fprintf(c.out, "==> Wrote certificate %s\n", certFile)
	fmt.Fprintf(c.out, "==> Wrote key %s (keep it on the %s's machine only)\n", keyFile, kind)
	return nil
}

// validUntil reads the expiry back from the issued certificate, since the
// CA may have capped it below --days.
func validUntil(certPEM []byte) string {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return "?"
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "?"
	}
	return cert.NotAfter.UTC().Format(time.DateOnly)
}
