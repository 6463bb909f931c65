// Command quicfloor is the transport's floor for iopbench (issue 25): a
// bare TCP-over-QUIC relay with no IOP code on its path, over quic-go with
// the QUIC configuration IOP's daemons use. Its two halves are processes,
// as edged and noded are:
//
//	quicfloor edge -http 127.0.0.1:0 -quic 127.0.0.1:0 -cert DIR/floor.pem
//	quicfloor node -edge 127.0.0.1:PORT -cert DIR/floor.pem -target 127.0.0.1:PORT
//
// The edge half listens for the node half's QUIC connection, then for
// clients' TCP connections, and opens one stream per TCP connection; the
// node half accepts each stream, dials the target (the model server), and
// both copy bytes until each direction ends. What a request costs through
// it is what QUIC itself costs on the machine: a figure of IOP's beside
// it, in the same run, shows how much is IOP's own (HTTP, dispatch,
// framing, the relay's client) and how much no relay over quic-go avoids.
//
// It is a measuring instrument, not a product: no authentication, one
// Node, loopback only. The edge half writes the certificate of a CA made
// for the run to -cert, which the node half trusts.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/pki"
)

// alpn is the floor's own protocol name: it never speaks to IOP's
// daemons. Its certificates are made for the run, in a trust domain of
// their own.
const (
	alpn        = "iop-quicfloor"
	trustDomain = "quicfloor.local"
	serverName  = "quicfloor"
)

// nodeStreams is the node half's stream limit, as a Node of that capacity
// would have (noded: DispatchedStreams of its providers' capacity).
const nodeStreams = 1024

func main() {
	log.SetFlags(0)
	log.SetPrefix("quicfloor: ")
	if len(os.Args) < 2 {
		log.Fatal("usage: quicfloor edge|node [flags]")
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	httpAddr := fs.String("http", "127.0.0.1:0", "edge: the TCP address clients connect to")
	quicAddr := fs.String("quic", "127.0.0.1:0", "edge: the UDP address the node half dials")
	edge := fs.String("edge", "", "node: the edge half's QUIC address")
	target := fs.String("target", "", "node: the model server's TCP address, host:port")
	cert := fs.String("cert", "", "edge: write the run's CA certificate (PEM) here; node: trust it")
	_ = fs.Parse(os.Args[2:])
	var err error
	switch mode {
	case "edge":
		err = runEdge(*httpAddr, *quicAddr, *cert)
	case "node":
		err = runNode(*edge, *cert, *target)
	default:
		err = fmt.Errorf("unknown mode %q: want edge or node", mode)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// runEdge serves clients over the first node connection until it ends.
func runEdge(httpAddr, quicAddr, certPath string) error {
	if certPath == "" {
		return errors.New("edge: -cert is required")
	}
	tlsConf, err := selfSigned(certPath)
	if err != nil {
		return err
	}
	ql, err := quic.ListenAddr(quicAddr, tlsConf, transport.EdgeQUICConfig(quicwire.DefaultLiveness))
	if err != nil {
		return fmt.Errorf("edge: %w", err)
	}
	defer ql.Close()
	fmt.Printf("quic on %s\n", ql.Addr())
	qc, err := ql.Accept(context.Background())
	if err != nil {
		return fmt.Errorf("edge: waiting for the node: %w", err)
	}
	ln, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return fmt.Errorf("edge: %w", err)
	}
	go func() {
		<-qc.Context().Done()
		ln.Close()
	}()
	fmt.Printf("listening on http://%s\n", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			if cause := context.Cause(qc.Context()); cause != nil {
				return fmt.Errorf("edge: the node's connection ended: %w", cause)
			}
			return fmt.Errorf("edge: %w", err)
		}
		go func() {
			defer c.Close()
			st, err := qc.OpenStreamSync(context.Background())
			if err != nil {
				return
			}
			pipe(c, st)
		}()
	}
}

// runNode relays each stream the edge half opens to target.
func runNode(edge, certPath, target string) error {
	if edge == "" || certPath == "" || target == "" {
		return errors.New("node: -edge, -cert and -target are required")
	}
	roots, err := pki.LoadPool(certPath)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	tlsConf := &tls.Config{RootCAs: roots, ServerName: serverName, NextProtos: []string{alpn}, MinVersion: tls.VersionTLS13}
	qc, err := quic.DialAddr(context.Background(), edge, tlsConf, transport.NodeQUICConfig(quicwire.DefaultLiveness, nodeStreams))
	if err != nil {
		return fmt.Errorf("node: dialing the edge half: %w", err)
	}
	for {
		st, err := qc.AcceptStream(context.Background())
		if err != nil {
			return fmt.Errorf("node: the edge's connection ended: %w", err)
		}
		go func() {
			c, err := net.Dial("tcp", target)
			if err != nil {
				st.CancelRead(1)
				st.CancelWrite(1)
				return
			}
			defer c.Close()
			pipe(c, st)
		}()
	}
}

// pipe copies c to st and st to c until both directions end: c's end is
// the stream's FIN, the stream's FIN is c's half-close. A reset or a
// failed write ends both.
func pipe(c net.Conn, st *quic.Stream) {
	up := make(chan struct{})
	go func() {
		defer close(up)
		if _, err := io.Copy(st, c); err != nil {
			st.CancelWrite(1)
			c.Close()
			return
		}
		st.Close()
	}()
	if _, err := io.Copy(c, st); err != nil {
		st.CancelRead(1)
		c.Close()
	} else if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	<-up
}

// selfSigned makes the run's CA and the edge half's certificate for
// "quicfloor", writes the CA's certificate to path and returns the
// server's TLS configuration.
func selfSigned(path string) (*tls.Config, error) {
	ca, err := pki.NewCA(trustDomain, pki.Options{Validity: 7 * 24 * time.Hour})
	if err != nil {
		return nil, fmt.Errorf("edge: %w", err)
	}
	cert, err := ca.IssueTLS(quicwire.EdgeIdentity(trustDomain, "quicfloor"), pki.Options{DNSNames: []string{serverName}})
	if err != nil {
		return nil, fmt.Errorf("edge: %w", err)
	}
	if err := os.WriteFile(path, ca.CertPEM(), 0o600); err != nil {
		return nil, fmt.Errorf("edge: writing the certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{alpn}, MinVersion: tls.VersionTLS13}, nil
}
