package frontdoor

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeConn is an accepted connection from remote that records its close.
type fakeConn struct {
	net.Conn // nil: only the methods below are called
	remote   net.Addr
	closed   atomic.Bool
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.remote }
func (c *fakeConn) Close() error         { c.closed.Store(true); return nil }

func from(addr string) *fakeConn {
	return &fakeConn{remote: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(addr))}
}

// accept admits a connection from addr through d; nil when refused.
func accept(t *testing.T, d *Door, addr string) (*trackedConn, *fakeConn) {
	t.Helper()
	fc := from(addr)
	tc := d.admit(fc)
	if (tc == nil) != fc.closed.Load() {
		t.Fatalf("from %s: admitted %v but closed %v", addr, tc != nil, fc.closed.Load())
	}
	return tc, fc
}

func refusals(c *prometheus.CounterVec, kind string) float64 {
	return testutil.ToFloat64(c.WithLabelValues(kind))
}

// Issue 24 gap 5 (P3): at the cap a new connection takes the place of the
// connection quiet longest (idle, or new with no request), once that one
// has been quiet for QuietGrace; within the grace, or with every
// connection in a request, the new one is refused. Closing the one that
// gave way is counted.
func TestAtTheCapAQuietConnectionGivesWayAfterTheGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refusals"}, []string{"kind"})
		d := New(Limits{MaxConns: 3, QuietGrace: 5 * time.Second}, NewRefusals(nil, counter))
		a, fa := accept(t, d, "127.0.0.1:1001") // new, silent
		time.Sleep(time.Second)
		b, fb := accept(t, d, "127.0.0.1:1002")
		c, fc := accept(t, d, "127.0.0.1:1003")
		d.connState(b, http.StateActive)
		d.connState(c, http.StateActive)
		d.connState(c, http.StateIdle) // one request, then idle
		if tc, _ := accept(t, d, "127.0.0.1:2001"); tc != nil {
			t.Fatal("a connection past the cap was admitted while every quiet one was within the grace")
		}
		if n := refusals(counter, "http_connections"); n != 1 {
			t.Errorf("refusals at the cap counted %v, want 1", n)
		}

		time.Sleep(4 * time.Second) // a quiet 5 s, c 4 s
		n1, _ := accept(t, d, "127.0.0.1:2002")
		if n1 == nil || !fa.closed.Load() || fb.closed.Load() || fc.closed.Load() {
			t.Fatalf("past the grace: admitted %v; closed a %v, b %v, c %v; want the silent a to give way",
				n1 != nil, fa.closed.Load(), fb.closed.Load(), fc.closed.Load())
		}
		if d.Conns() != 3 || refusals(counter, "http_idle_closed") != 1 {
			t.Errorf("%d open, %v closed to make room; want 3 and 1", d.Conns(), refusals(counter, "http_idle_closed"))
		}
		a.Close() // net/http's close after the eviction: counted once
		if d.Conns() != 3 {
			t.Errorf("closing the evicted connection again: %d open, want 3", d.Conns())
		}

		// c, idle for 4 s, is not yet past the grace; b is in a request.
		if tc, _ := accept(t, d, "127.0.0.1:2003"); tc != nil {
			t.Fatal("admitted by closing a connection within its grace")
		}
		time.Sleep(time.Second)
		d.connState(n1, http.StateActive)
		n2, _ := accept(t, d, "127.0.0.1:2004")
		if n2 == nil || !fc.closed.Load() || fb.closed.Load() {
			t.Fatalf("admitted %v, c closed %v, b closed %v; want idle c to give way and active b kept", n2 != nil, fc.closed.Load(), fb.closed.Load())
		}

		// A connection in a request never gives way, however long.
		d.connState(n2, http.StateActive)
		time.Sleep(time.Hour)
		if tc, _ := accept(t, d, "127.0.0.1:2005"); tc != nil {
			t.Fatal("a connection in a request was closed to admit another")
		}
		// Closed connections leave the table.
		d.connState(b, http.StateClosed)
		b.Close()
		if d.Conns() != 2 {
			t.Errorf("%d open after a close, want 2", d.Conns())
		}
		if tc, _ := accept(t, d, "127.0.0.1:2006"); tc == nil {
			t.Fatal("refused with a free slot")
		}
	})
}

// The connection quiet longest gives way first: an idle connection goes
// to the back of the line each time it falls quiet.
func TestTheConnectionQuietLongestGivesWayFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New(Limits{MaxConns: 3, QuietGrace: time.Second}, nil)
		var fakes []*fakeConn
		var conns []*trackedConn
		for i := range 3 {
			tc, fc := accept(t, d, fmt.Sprintf("127.0.0.1:%d", 1000+i))
			conns, fakes = append(conns, tc), append(fakes, fc)
			time.Sleep(time.Second)
		}
		// The first serves a request, so it is now the freshest.
		d.connState(conns[0], http.StateActive)
		d.connState(conns[0], http.StateIdle)
		time.Sleep(2 * time.Second)
		for _, want := range []int{1, 2, 0} {
			if tc, _ := accept(t, d, "127.0.0.1:9000"); tc == nil {
				t.Fatal("refused with quiet connections past the grace")
			}
			if !fakes[want].closed.Load() {
				t.Fatalf("connection %d did not give way in its turn", want)
			}
		}
	})
}

// Issue 24 gap 5: one source (an IPv4 address, an IPv6 /64) holds at most
// MaxConnsPerSource; its next connection takes the place of its own quiet
// longest past the grace, or is refused, and counted. Other sources, and
// loopback (not counted per source), are admitted.
func TestOneSourceHoldsAtMostItsShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refusals"}, []string{"kind"})
		d := New(Limits{MaxConns: 100, MaxConnsPerSource: 2, QuietGrace: 5 * time.Second}, NewRefusals(nil, counter))
		if d.Limits().MaxConnsPerSource != 2 {
			t.Fatalf("per source %d", d.Limits().MaxConnsPerSource)
		}
		_, first := accept(t, d, "192.0.2.7:1000")
		accept(t, d, "192.0.2.7:1001")
		if tc, _ := accept(t, d, "192.0.2.7:1002"); tc != nil {
			t.Fatal("a third connection from one source was admitted at max 2")
		}
		if refusals(counter, "http_connections_per_source") != 1 {
			t.Errorf("per-source refusals counted %v, want 1", refusals(counter, "http_connections_per_source"))
		}
		// IPv4-mapped is the same address.
		if tc, _ := accept(t, d, "[::ffff:192.0.2.7]:1003"); tc != nil {
			t.Fatal("the same address, IPv4-mapped, was counted apart")
		}
		// One IPv6 /64 is one source, whatever the interface id.
		accept(t, d, "[2001:db8:1:2::1]:1000")
		accept(t, d, "[2001:db8:1:2::ffff]:1000")
		if tc, _ := accept(t, d, "[2001:db8:1:2:dead:beef::9]:1000"); tc != nil {
			t.Fatal("a third connection from one IPv6 /64 was admitted at max 2")
		}
		if tc, _ := accept(t, d, "[2001:db8:1:3::1]:1000"); tc == nil {
			t.Fatal("another /64 was refused")
		}
		if tc, _ := accept(t, d, "198.51.100.1:1000"); tc == nil {
			t.Fatal("another source was refused")
		}
		for i := range 20 {
			if tc, _ := accept(t, d, fmt.Sprintf("127.0.0.1:%d", 3000+i)); tc == nil {
				t.Fatalf("loopback connection %d refused: loopback is not capped per source", i)
			}
		}
		// Past the grace, the source's next takes the place of its own
		// oldest.
		time.Sleep(5 * time.Second)
		if tc, _ := accept(t, d, "192.0.2.7:1004"); tc == nil || !first.closed.Load() {
			t.Fatalf("past the grace: admitted %v, the source's first closed %v", tc != nil, first.closed.Load())
		}
	})
}

// The per-source cap defaults to an eighth of MaxConns, at least one, and
// is never above MaxConns.
func TestPerSourceDefaults(t *testing.T) {
	for _, tt := range []struct{ max, per, want int }{{4096, 0, 512}, {4, 0, 1}, {10, 50, 10}, {10, 3, 3}} {
		if got := New(Limits{MaxConns: tt.max, MaxConnsPerSource: tt.per}, nil).Limits().MaxConnsPerSource; got != tt.want {
			t.Errorf("MaxConns %d, per source %d: %d, want %d", tt.max, tt.per, got, tt.want)
		}
	}
}

// chanListener is a listener whose Accept waits on a channel, so that a
// synctest bubble sees it blocked.
type chanListener struct {
	conns chan net.Conn
	done  chan struct{}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *chanListener) Close() error   { close(l.done); return nil }
func (l *chanListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// The poller gives a parked connection back without waiting (issue 25: no
// goroutine to hand it over): the server's Accept takes it at once when it
// is waiting; when it is not, the give-back is busy and the caller waits
// elsewhere; once the listener is closed it is refused, waiting or not.
func TestAGiveBackWithoutWaitingGoesOnlyToAWaitingAccept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newCapListener(&chanListener{conns: make(chan net.Conn), done: make(chan struct{})}, New(Limits{}, nil))
		c := &trackedConn{}
		if got := l.giveBack(c, false); got != busy {
			t.Fatalf("no Accept waiting: %v, want busy", got)
		}
		accepted := make(chan net.Conn, 1)
		go func() {
			nc, _ := l.Accept()
			accepted <- nc
		}()
		synctest.Wait() // Accept waits
		if got := l.giveBack(c, false); got != handed {
			t.Fatalf("Accept waiting: %v, want handed", got)
		}
		if nc := <-accepted; nc != net.Conn(c) {
			t.Fatalf("Accept returned %v, not the connection given back", nc)
		}
		l.Close()
		if got := l.giveBack(c, false); got != refused {
			t.Errorf("listener closed, not waiting: %v, want refused", got)
		}
		if got := l.giveBack(c, true); got != refused {
			t.Errorf("listener closed, waiting: %v, want refused", got)
		}
	})
}
