package integration

import (
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// udpRelay forwards UDP datagrams between its clients and one upstream
// address, delaying each datagram by a fixed time in each direction and
// dropping a share of them: the delay and loss that netem would add, for a
// kernel without it. Each client address gets its own socket towards the
// upstream, so the upstream sees one peer per client.
type udpRelay struct {
	ln       *net.UDPConn
	upstream *net.UDPAddr
	delay    time.Duration
	loss     float64 // the share of datagrams dropped, each direction

	mu       sync.Mutex
	sessions map[string]*net.UDPConn // by client address
	closed   bool
	wg       sync.WaitGroup

	forwarded, dropped atomic.Int64
}

// newUDPRelay listens on 127.0.0.1 and relays to upstream until the end of
// the test.
func newUDPRelay(t *testing.T, upstream string, delay time.Duration, loss float64) *udpRelay {
	t.Helper()
	up, err := net.ResolveUDPAddr("udp", upstream)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	r := &udpRelay{ln: ln, upstream: up, delay: delay, loss: loss, sessions: map[string]*net.UDPConn{}}
	r.wg.Add(1)
	go r.fromClients()
	t.Cleanup(r.close)
	return r
}

// addr is where clients send.
func (r *udpRelay) addr() string { return r.ln.LocalAddr().String() }

// fromClients reads what clients send and passes it upstream, each client
// through its own upstream socket.
func (r *udpRelay) fromClients() {
	defer r.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, client, err := r.ln.ReadFromUDP(buf)
		if err != nil {
			return
		}
		up, err := r.session(client)
		if err != nil {
			return
		}
		r.later(buf[:n], func(b []byte) { up.Write(b) })
	}
}

// session returns the client's upstream socket, opening it (and the
// goroutine that relays the answers back) on the client's first datagram.
func (r *udpRelay) session(client *net.UDPAddr) (*net.UDPConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errors.New("relay closed")
	}
	if c := r.sessions[client.String()]; c != nil {
		return c, nil
	}
	c, err := net.DialUDP("udp", nil, r.upstream)
	if err != nil {
		return nil, err
	}
	r.sessions[client.String()] = c
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			r.later(buf[:n], func(b []byte) { r.ln.WriteToUDP(b, client) })
		}
	}()
	return c, nil
}

// later sends a copy of b after the delay, unless the datagram is lost.
func (r *udpRelay) later(b []byte, send func([]byte)) {
	if rand.Float64() < r.loss {
		r.dropped.Add(1)
		return
	}
	r.forwarded.Add(1)
	cp := append([]byte(nil), b...)
	time.AfterFunc(r.delay, func() { send(cp) })
}

func (r *udpRelay) close() {
	r.mu.Lock()
	r.closed = true
	r.ln.Close()
	for _, c := range r.sessions {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	// Datagrams still in their delay go to closed sockets and are lost.
}
