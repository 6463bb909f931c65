package execution

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The Node's hop of a raw tunnel, per token: the provider's chunked answer
// read from TCP, each read made a body frame, passed through the
// watchdog's fence and the tunnel's order, and encoded as the QUIC stream
// would (quicwire's length-prefixed frame). The QUIC send itself is
// quicwire's hop (BenchmarkStreamFrames there). The provider is a raw TCP
// server that writes one pre-encoded chunk per token with one syscall; its
// cost is part of the figure.
//
// "sparse" is a token at a time (the provider writes the next chunk once
// the Node has sent the last one: one read, one frame and two wake-ups per
// token, as when tokens come milliseconds apart); "burst" is the answer
// written back to back (reads carry several tokens).
//
//	go test -run '^$' -bench TunnelNodeHop -benchmem ./internal/node/execution
func BenchmarkTunnelNodeHop(b *testing.B) {
	for _, sparse := range []bool{true, false} {
		name := "burst"
		if sparse {
			name = "sparse"
		}
		b.Run(name, func(b *testing.B) { benchNodeHop(b, sparse) })
	}
}

func benchNodeHop(b *testing.B, sparse bool) {
	const line = `{"model":"m","created_at":"2026-12-01T00:00:00Z","message":{"role":"assistant","content":"tok "},"done":false}` + "\n"
	chunk := fmt.Sprintf("%x\r\n%s\r\n", len(line), line)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	st := &encodingStream{}
	var sent chan struct{}
	if sparse {
		sent = make(chan struct{}, 1)
		st.sent = sent
	}
	tokens := make(chan int, 1)
	go serveChunks(ln, chunk, tokens, sent)

	_, h := onlineSet(b, 1, newRoutePlugin("http://"+ln.Addr().String()))
	tokens <- b.N
	b.ReportAllocs()
	b.ResetTimer()
	h.serveTunnel(context.Background(), nil, tunnelReq("bench"), st)
	b.StopTimer()
	if st.bodyBytes != b.N*len(line) || st.terminal.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED {
		b.Fatalf("relayed %d body bytes of %d, terminal %v", st.bodyBytes, b.N*len(line), st.terminal)
	}
	b.ReportMetric(float64(st.frames)/float64(b.N), "frames/token")
}

// serveChunks answers one HTTP request per connection on ln with a chunked
// body of n chunks (n read from tokens for each request). With sent, it
// writes each chunk after the one before it was relayed.
func serveChunks(ln net.Listener, chunk string, tokens <-chan int, sent <-chan struct{}) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			br := bufio.NewReader(c)
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				if line == "\r\n" {
					break
				}
			}
			n := <-tokens
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
				return
			}
			if sent != nil {
				<-sent // the head
			}
			for range n {
				if _, err := io.WriteString(c, chunk); err != nil {
					return
				}
				if sent != nil {
					<-sent
				}
			}
			io.WriteString(c, "0\r\n\r\n")
		}()
	}
}

// encodingStream is a tunnel stream whose Edge sent an empty body: what the
// Node sends is encoded as quicwire does, and counted.
type encodingStream struct {
	sent      chan<- struct{} // told of every head and body frame, if not nil
	fw        *transport.FrameWriter
	frames    int
	bodyBytes int
	terminal  *wirepb.TunnelTerminal
}

func (s *encodingStream) Send(m proto.Message) error {
	if s.fw == nil {
		s.fw = transport.NewFrameWriter(io.Discard, quicwire.MaxStreamFrameSize)
	}
	if err := s.fw.Write(m); err != nil {
		return err
	}
	s.frames++
	f := m.(*wirepb.TunnelFrame)
	s.bodyBytes += len(f.GetBody())
	if t := f.GetTerminal(); t != nil {
		s.terminal = t
	} else if s.sent != nil {
		s.sent <- struct{}{}
	}
	return nil
}

func (s *encodingStream) Recv(proto.Message) error { return io.EOF }
