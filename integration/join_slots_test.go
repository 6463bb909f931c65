package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/enroll"
)

// Issue 24 gap 6: the join protocol takes connections from anyone, so its
// slots must not be something strangers can hold. A stranger is a QUIC
// client from this process that completes the join handshake (the join
// ALPN asks for no certificate) and then sends nothing.

// stranger opens a join connection to edge from ip and sends nothing. The
// connection is closed at the end of the test if the Edge has not closed
// it. Safe to call from any goroutine.
func stranger(t *testing.T, ip, edge string) (*quic.Conn, error) {
	raddr, err := net.ResolveUDPAddr("udp", edge)
	if err != nil {
		return nil, err
	}
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(ip)})
	if err != nil {
		return nil, fmt.Errorf("bind %s: %w", ip, err)
	}
	tr := &quic.Transport{Conn: udp}
	t.Cleanup(func() { tr.Close(); udp.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	qc, err := tr.Dial(ctx, raddr,
		&tls.Config{InsecureSkipVerify: true, NextProtos: []string{enroll.JoinALPN}, MinVersion: tls.VersionTLS13}, // a stranger checks nothing
		&quic.Config{HandshakeIdleTimeout: 5 * time.Second, MaxIdleTimeout: 30 * time.Second, KeepAlivePeriod: time.Second})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { qc.CloseWithError(0, "") })
	return qc, nil
}

// refusedBusy reports whether qc was closed by the Edge because its join
// slots were taken.
func refusedBusy(qc *quic.Conn) bool {
	cc := quicwire.ConnCause(qc)
	return cc != nil && cc.Remote && cc.Code == quicwire.CloseRefused && strings.Contains(cc.Detail, "too many joins")
}

// P3, P5, issue 24 gap 6: sixteen silent join connections from one address
// take at most two join slots; the rest are refused at once, and a real
// `noded join` from another address joins at its first try. A request
// begun and never finished is closed at the first-request deadline.
func TestJoinSlotsAreSharedOutPerSourceAddress(t *testing.T) {
	fake := fakeollama.New(fakeollama.Model{Name: "tiny:latest", Text: "hello"})
	t.Cleanup(fake.Close)
	e := enrollSetup(t, false)
	e.start()
	addr, token, _ := e.add("n1")

	conns := make([]*quic.Conn, 16)
	for i := range conns {
		qc, err := stranger(t, "127.0.0.2", e.quic)
		if err != nil {
			t.Fatalf("stranger %d: %v", i, err)
		}
		conns[i] = qc
	}
	// Fourteen of them are turned away as soon as the Edge sees them.
	refused := func() (n int) {
		for _, qc := range conns {
			if refusedBusy(qc) {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(5 * time.Second); refused() < len(conns)-2 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if n := refused(); n != len(conns)-2 {
		t.Errorf("%d of %d silent join connections from one address refused at once, want %d", n, len(conns), len(conns)-2)
	}

	began := time.Now()
	out, err := run(t, "", bin.noded, joinArgs(addr, token, filepath.Join(t.TempDir(), "node"), fake)...)
	if err != nil || !strings.Contains(out, "Joined Edge edge-1 as spiffe://iop.test/node/n1") {
		t.Fatalf("noded join beside the strangers: %v\n%s", err, out)
	}
	if strings.Contains(out, "retrying") {
		t.Errorf("noded join had to retry though the strangers came from another address:\n%s", out)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("noded join took %s", d)
	}
	e.proc.waitOutput(regexp.MustCompile(`join refused: too many at once from one address`))

	// A request begun and never finished is as silent: closed once the
	// first-request deadline has passed, saying so.
	qc, err := stranger(t, "127.0.0.3", e.quic)
	if err != nil {
		t.Fatal(err)
	}
	st, err := qc.OpenStreamSync(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte{0x80}); err != nil { // the first byte of a length prefix
		t.Fatal(err)
	}
	dialed := time.Now()
	select {
	case <-qc.Context().Done():
		cc := quicwire.ConnCause(qc)
		if cc == nil || !cc.Remote || cc.Code != quicwire.CloseRefused || !strings.Contains(cc.Detail, "no join request within") {
			t.Errorf("a request begun and not finished: closed with %v; want refused, no join request in time", cc)
		}
		if d := time.Since(dialed); d > 10*time.Second {
			t.Errorf("a request begun and not finished held its slot %s", d)
		}
	case <-time.After(20 * time.Second):
		t.Error("a request begun and not finished held its slot 20 s")
	}
}

// P3, P5, issue 24 gap 6: silent join connections from sixteen addresses fill
// every join slot, but each is closed once it has not sent its request
// within the first-request deadline (not held for the whole 15 s
// exchange), and `noded join` refused meanwhile says the Edge is busy and
// tries again until it joins.
func TestNodeJoinRetriesWhileStrangersHoldEverySlot(t *testing.T) {
	fake := fakeollama.New(fakeollama.Model{Name: "tiny:latest", Text: "hello"})
	t.Cleanup(fake.Close)
	e := enrollSetup(t, false)
	e.start()
	addr, token, _ := e.add("n1")

	// Sixteen strangers, one per address, each dialing again as soon as
	// the Edge closes it, until told to stop: every slot stays taken.
	stop := make(chan struct{})
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		holds []time.Duration // how long the Edge let a silent stranger hold its slot
	)
	for i := range 16 {
		ip := fmt.Sprintf("127.0.0.%d", 2+i)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				qc, err := stranger(t, ip, e.quic)
				if err != nil {
					if t.Context().Err() == nil {
						t.Errorf("stranger %s: %v", ip, err)
					}
					return
				}
				// Told to stop or not, it stays until the Edge closes it
				// (or for longer than the whole exchange may take).
				dialed := time.Now()
				select {
				case <-qc.Context().Done():
					if refusedBusy(qc) {
						time.Sleep(50 * time.Millisecond) // a stranger, not a flood
						continue
					}
					if cc := quicwire.ConnCause(qc); cc != nil && cc.Remote {
						mu.Lock()
						holds = append(holds, time.Since(dialed))
						mu.Unlock()
					}
				case <-time.After(20 * time.Second):
					mu.Lock()
					holds = append(holds, time.Since(dialed))
					mu.Unlock()
					return
				}
			}
		})
	}
	t.Cleanup(wg.Wait)
	t.Cleanup(func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
	})

	// Every slot is taken once a probe from yet another address is
	// refused for want of one (and not for its address).
	full := false
	for probe := 0; !full && probe < 50; probe++ {
		qc, err := stranger(t, fmt.Sprintf("127.0.1.%d", 1+probe), e.quic)
		if err != nil {
			t.Fatalf("probe: %v", err)
		}
		select {
		case <-qc.Context().Done():
			cc := quicwire.ConnCause(qc)
			full = refusedBusy(qc) && !strings.Contains(cc.Detail, "address")
		case <-time.After(500 * time.Millisecond): // it got a slot: the strangers have not taken them all yet
			qc.CloseWithError(0, "")
		}
	}
	if !full {
		t.Fatal("the strangers never held every join slot")
	}

	nodeDir := filepath.Join(t.TempDir(), "node")
	node := start(t, "noded join", bin.noded, joinArgs(addr, token, nodeDir, fake)...)
	node.waitOutput(regexp.MustCompile(`edge busy \(too many joins at once.*\), retrying in \d`))
	close(stop)
	select {
	case <-node.done:
		if out := node.out.String(); node.waitErr != nil || !strings.Contains(out, "Joined Edge edge-1 as spiffe://iop.test/node/n1") {
			t.Errorf("noded join: %v\n%s", node.waitErr, out)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("noded join did not end within 60 s of the strangers' last attempt")
	}

	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(holds) == 0 {
		t.Fatal("no silent stranger was closed by the Edge")
	}
	for _, d := range holds {
		if d > 10*time.Second {
			t.Errorf("a silent join connection held its slot %s; want it closed after the first-request deadline", d)
		}
	}
}
