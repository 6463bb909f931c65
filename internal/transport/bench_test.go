package transport_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The QUIC hop between Node and Edge, per token: one body frame (a token's
// line, as the tunnel relays it) sent by the Node on a stream the Edge
// opened, and read by the Edge, over real QUIC on loopback with the daemons'
// configuration (loopback TLS). Both ends are in this process, so the
// figure is the whole hop: encode, the QUIC send and receive paths with
// their packets and acknowledgements, and decode.
//
// "sparse" sends a frame once the last one has been read (a packet per
// token, as when tokens come milliseconds apart); "burst" sends back to
// back (frames share packets). streams=64 spreads sparse tokens over 64
// streams of one connection at once, as 64 concurrent answers do.
//
//	go test -run '^$' -bench StreamFrames -benchmem ./internal/transport
func BenchmarkStreamFrames(b *testing.B) {
	for _, c := range []struct {
		name    string
		streams int
		sparse  bool
	}{{"sparse", 1, true}, {"burst", 1, false}, {"sparse/streams=64", 64, true}} {
		b.Run(c.name, func(b *testing.B) { benchStreamFrames(b, c.streams, c.sparse) })
	}
}

func benchStreamFrames(b *testing.B, streams int, sparse bool) {
	edge, node := connPair(b)
	frame := &wirepb.TunnelFrame{Frame: &wirepb.TunnelFrame_Body{Body: []byte(
		`{"model":"m","created_at":"2026-12-01T00:00:00Z","message":{"role":"assistant","content":"tok "},"done":false}` + "\n")}}
	per := b.N / streams
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for range streams {
		// The Edge opens the stream with its header, as a dispatch does;
		// the Node answers on it.
		es, err := edge.OpenStreamSync(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		e := transport.NewStream(es, "tunnel")
		if err := e.Send(frame); err != nil {
			b.Fatal(err)
		}
		ns, err := node.AcceptStream(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		n := transport.NewStream(ns, "tunnel")
		if err := n.Recv(new(wirepb.TunnelFrame)); err != nil {
			b.Fatal(err)
		}
		read := make(chan struct{}, 1)
		wg.Go(func() {
			for range per {
				if err := n.Send(frame); err != nil {
					b.Error(err)
					return
				}
				if sparse {
					<-read
				}
			}
			n.CloseSend()
		})
		wg.Go(func() {
			f := new(wirepb.TunnelFrame)
			for {
				if err := e.Recv(f); err != nil {
					if err != io.EOF {
						b.Error(err)
					}
					return
				}
				if sparse {
					read <- struct{}{}
				}
			}
		})
	}
	wg.Wait()
}

// connPair is a QUIC connection on loopback between an Edge and a Node
// endpoint, with the daemons' settings.
func connPair(b testing.TB) (edge, node *quic.Conn) {
	b.Helper()
	tlsEdge, err := quicwire.LoopbackEdgeTLSConfig()
	if err != nil {
		b.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	tr := &quic.Transport{Conn: pc}
	b.Cleanup(func() { tr.Close() })
	ln, err := tr.Listen(tlsEdge, transport.EdgeQUICConfig(quicwire.DefaultLiveness))
	if err != nil {
		b.Fatal(err)
	}
	accepted := make(chan *quic.Conn, 1)
	go func() {
		c, err := ln.Accept(context.Background())
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	node, err = quic.DialAddr(context.Background(), pc.LocalAddr().String(), quicwire.LoopbackNodeTLSConfig(), transport.NodeQUICConfig(quicwire.DefaultLiveness, 256))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { node.CloseWithError(0, "") })
	edge, ok := <-accepted
	if !ok {
		b.Fatal(fmt.Errorf("no connection accepted"))
	}
	return edge, node
}
