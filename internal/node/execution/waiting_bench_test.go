package execution

import (
	"bufio"
	"context"
	"net"
	"runtime"
	"sync"
	"testing"

	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// What a waiting call costs the Node (issue 25): N calls in a silent
// prefill, each served on its own goroutine as the transport serves a
// stream, against a provider that never answers. It reports the goroutines
// and the bytes (heap in use plus goroutine stacks) each waiting call
// holds, measured once all N are waiting, beside none, and how much of
// those bytes are stacks.
//
// "tunnel" is a raw tunnel the Node relays itself (a route): the provider
// is a TCP server that reads the request head and says nothing;
// "tunnel-nethttp" the same on net/http's Transport (what https and
// proxied servers get) rather than relayTransport.
// "normalized" is a run whose adapter waits in-process for its context
// (the plugin host's own cost is not in it).
//
//	go test -run '^$' -bench WaitingCalls -benchtime 1000x ./internal/node/execution
func BenchmarkWaitingCalls(b *testing.B) {
	b.Run("tunnel", func(b *testing.B) { benchWaiting(b, true, false) })
	b.Run("tunnel-nethttp", func(b *testing.B) { benchWaiting(b, true, true) })
	b.Run("normalized", func(b *testing.B) { benchWaiting(b, false, false) })
}

func benchWaiting(b *testing.B, tunnel, netHTTP bool) {
	n := b.N
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	// One goroutine serves every connection, so the provider's side adds
	// none per call: it reads each request head and keeps the connection,
	// silent, until the end.
	arrived := make(chan struct{}, n)
	var held []net.Conn
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
			br := bufio.NewReader(c)
			for {
				line, err := br.ReadString('\n')
				if err != nil || line == "\r\n" {
					break
				}
			}
			arrived <- struct{}{}
		}
	}()
	entered := make(chan struct{}, n)
	var pl Plugin = newRoutePlugin("http://" + ln.Addr().String())
	if !tunnel {
		pl = newFakePlugin(func(ctx context.Context, _ *wirepb.RunRequest, _ func(*wirepb.RunEvent) error) (*sdk.Result, error) {
			entered <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		})
	}
	set, h := onlineSet(b, n, pl)
	if netHTTP {
		relay := set.Providers()[0].relay
		relay.Transport = relay.Transport.(*relayTransport).fallback
	}
	ctx, cancel := context.WithCancel(b.Context())

	before := waitingFootprint()
	b.ResetTimer()
	var served sync.WaitGroup
	for range n {
		served.Go(func() {
			if tunnel {
				h.serveTunnel(ctx, nil, tunnelReq("w"), &encodingStream{})
				return
			}
			st := waitingRunStream{newFakeStream()}
			defer st.cancel() // the transport finishes the stream after the handler
			h.serveRun(ctx, nil, run("w"), st)
		})
	}
	for range n {
		if tunnel {
			<-arrived
		} else {
			<-entered
		}
	}
	b.StopTimer()
	after := waitingFootprint()
	b.ReportMetric(float64(after.goroutines-before.goroutines)/float64(n), "goroutines/call")
	b.ReportMetric(float64(after.bytes-before.bytes)/float64(n), "B/call")
	b.ReportMetric(float64(after.stack-before.stack)/float64(n), "stackB/call")
	cancel()
	served.Wait()
	ln.Close()
	<-accepting
	for _, c := range held {
		c.Close()
	}
}

// waitingRunStream is a run stream whose write side can tell when it
// ends, as a QUIC stream's does; here it never does.
type waitingRunStream struct{ *fakeStream }

func (waitingRunStream) Context() context.Context { return context.Background() }

type footprint struct {
	goroutines   int
	bytes, stack uint64
}

// waitingFootprint is the goroutines and the bytes in use (heap objects
// and goroutine stacks) after a collection.
func waitingFootprint() footprint {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return footprint{runtime.NumGoroutine(), ms.HeapInuse + ms.StackInuse, ms.StackInuse}
}
