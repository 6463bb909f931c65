package registrar

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/pgtest"
)

// silentProxy forwards TCP to a PostgreSQL until silenced: then it keeps
// every connection open and passes nothing, as a partitioned network or a
// hung server does (no refusal, no reset: only silence).
type silentProxy struct {
	ln     net.Listener
	target string
	silent atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newSilentProxy(t *testing.T, target string) *silentProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &silentProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *silentProxy) keep(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *silentProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.keep(c)
		if p.silent.Load() {
			continue // held open, never answered
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.keep(up)
		p.wg.Go(func() { p.pipe(up, c) })
		p.wg.Go(func() { p.pipe(c, up) })
	}
}

// pipe copies src to dst while the proxy is not silent, and drops what
// comes once it is.
func (p *silentProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.silent.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Fail static against a database that goes silent rather than away: no
// call waits past its deadline. A connection check answers from what the
// Edge knew within standingTimeout, and at once after the first; a write
// is refused as unreachable within opTimeout.
func TestASilentDatabaseIsGivenUpOnWithinTheDeadlines(t *testing.T) {
	srv := pgtest.NewServer(t)
	dsn := srv.CreateDatabase(t)
	proxy := newSilentProxy(t, fmt.Sprintf("127.0.0.1:%d", srv.Port()))
	dsn = strings.Replace(dsn, fmt.Sprintf(":%d/", srv.Port()), fmt.Sprintf(":%d/", proxy.ln.Addr().(*net.TCPAddr).Port), 1)

	ca := newTestCA(t)
	e := newClusterEdges(t, dsn, ca, 1)[0]
	tok, _, _ := e.svc.NewToken("gpu-1", time.Hour)
	leaf, err := x509.ParseCertificate(e.join(t, tok).GetChain()[0])
	if err != nil {
		t.Fatal(err)
	}

	proxy.silent.Store(true)
	start := time.Now()
	if err := e.svc.Admit("gpu-1", leaf); err != nil {
		t.Fatalf("a known Node, database silent: %v", err)
	}
	first := time.Since(start)
	start = time.Now()
	if err := e.svc.Check("gpu-1", leaf); err != nil {
		t.Fatalf("a known Node, again: %v", err)
	}
	second := time.Since(start)
	t.Logf("checks with the database silent: first %v, then %v", first, second)
	if first > standingTimeout+time.Second || second > 100*time.Millisecond {
		t.Errorf("checks took %v, then %v; want at most %v, then at once", first, second, standingTimeout)
	}

	start = time.Now()
	_, _, err = e.svc.Remove("gpu-1")
	took := time.Since(start)
	t.Logf("a removal with the database silent was refused after %v: %v", took, err)
	if !errors.Is(err, ErrDatabaseUnreachable) {
		t.Errorf("remove: %v, want ErrDatabaseUnreachable", err)
	}
	if took > opTimeout+2*time.Second {
		t.Errorf("the removal took %v, over its deadline %v", took, opTimeout)
	}
}
