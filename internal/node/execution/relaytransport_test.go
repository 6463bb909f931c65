package execution

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/netpeek"
)

// newTestRelayClient is newRelayClient's client, on the relay's own
// transport.
func newTestRelayClient() *http.Client {
	c := newRelayClient(4)
	if _, ok := c.Transport.(*relayTransport); !ok {
		panic(fmt.Sprintf("newRelayClient's transport is %T, not the relay's own", c.Transport))
	}
	return c
}

// countingServer is an HTTP server that counts the connections it accepted.
func countingServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func get(t *testing.T, c *http.Client, ctx context.Context, url, body string) (*http.Response, error) {
	t.Helper()
	var rd io.Reader = http.NoBody
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	return c.Do(req)
}

// Answers read to their end (chunked and with a length) leave their
// connection for the next request; the request's body reaches the server.
func TestRelayTransportReusesAConnection(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/chunked" {
			w.(http.Flusher).Flush()
		}
		fmt.Fprintf(w, "got %s", b)
	})
	c := newTestRelayClient()
	for i, path := range []string{"/chunked", "/length", "/chunked"} {
		resp, err := get(t, c, t.Context(), srv.URL+path, fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != fmt.Sprintf("got %d", i) {
			t.Fatalf("%s: %q, %v", path, b, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 3 requests in a row, want 1", n)
	}
}

// A HEAD's answer announces a length but has no body: the transport reads
// it as such (it keeps only the method once the request is written) and
// the connection serves the next request.
func TestRelayTransportHeadAnswerHasNoBody(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "11")
		if r.Method != http.MethodHead {
			io.WriteString(w, "hello world")
		}
	})
	c := newTestRelayClient()
	// Bounded so that a HEAD's answer read as having a body (which the
	// server never sends) fails the test instead of hanging it.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, method := range []string{http.MethodHead, http.MethodGet, http.MethodHead} {
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+"/api/version", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := "hello world"
		if method == http.MethodHead {
			want = ""
		}
		if err != nil || string(b) != want || resp.ContentLength != 11 {
			t.Fatalf("%s: body %q (length %d), %v; want %q", method, b, resp.ContentLength, err, want)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 3 requests in a row, want 1", n)
	}
}

// A connection the server closed while idle is found before reuse: the
// next request goes on a new one.
func TestRelayTransportDropsAConnectionClosedWhileIdle(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed := make(chan struct{}, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			br := bufio.NewReader(c)
			for {
				line, err := br.ReadString('\n')
				if err != nil || line == "\r\n" {
					break
				}
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			c.Close() // without saying so: a keep-alive timeout
			closed <- struct{}{}
		}
	}()
	c := newTestRelayClient()
	rt := c.Transport.(*relayTransport)
	for range 2 {
		resp, err := get(t, c, t.Context(), "http://"+ln.Addr().String()+"/", "")
		if err != nil {
			t.Fatal(err)
		}
		if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "ok" {
			t.Fatalf("%q, %v", b, err)
		}
		resp.Body.Close()
		<-closed
		// Wait until the server's FIN has reached the kept connection.
		for deadline := time.Now().Add(5 * time.Second); ; runtime.Gosched() {
			rt.mu.Lock()
			idle := rt.idle[ln.Addr().String()]
			rt.mu.Unlock()
			if len(idle) != 1 {
				t.Fatalf("%d connections kept, want 1", len(idle))
			}
			if !alive(idle[0].Conn) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the server's close never showed")
			}
		}
	}
}

// The context's end unblocks a request waiting on a silent server, which
// sees its connection closed; an answer given up before its end closes
// its connection rather than reading out the rest.
func TestRelayTransportCancelAndEarlyClose(t *testing.T) {
	started, gone := make(chan struct{}, 3), make(chan struct{}, 3)
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		if r.URL.Path == "/partial" {
			fmt.Fprintln(w, "first")
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done()
		gone <- struct{}{}
	})
	c := newTestRelayClient()
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := get(t, c, ctx, srv.URL+"/silent", "")
		errc <- err
	}()
	<-started
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled while waiting: %v, want context.Canceled", err)
	}
	<-gone

	resp, err := get(t, c, t.Context(), srv.URL+"/partial", "")
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("%q, %v", line, err)
	}
	resp.Body.Close() // before the end: the server is still silent
	<-gone
	resp, err = get(t, c, t.Context(), srv.URL+"/partial", "")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	<-gone
	if n := conns.Load(); n != 3 {
		t.Errorf("%d connections, want 3 (none given up is reused)", n)
	}
}

// An informational answer is skipped for the real one; https goes to the
// fallback (net/http's Transport).
func TestRelayTransportInformationalAndFallback(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil || line == "\r\n" {
				break
			}
		}
		io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	}()
	c := newTestRelayClient()
	resp, err := get(t, c, t.Context(), "http://"+ln.Addr().String()+"/", "")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(b) != "ok" {
		t.Errorf("answer %d %q, want 200 ok", resp.StatusCode, b)
	}
	resp.Body.Close()

	tls := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls") }))
	defer tls.Close()
	fb := tls.Client().Transport.(*http.Transport).Clone()
	c.Transport = newRelayTransport(fb, 4)
	resp, err = get(t, c, t.Context(), tls.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "tls" {
		t.Errorf("over https: %q", b)
	}
	resp.Body.Close()
}

// Issue 25 (P3): a connection holds its read buffer only while an answer
// is read: waitReadable waits with none (and ends at the connection's
// deadline, as a read would), and a connection whose answer was read whole
// gives it back before it idles; one with bytes after its answer cannot
// be reused.
func TestRelayConnHoldsItsReadBufferOnlyWhileReading(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	peer := <-accepted
	defer peer.Close()

	_ = nc.SetReadDeadline(time.Now().Add(-time.Second))
	if err := netpeek.WaitReadable(nc); runtime.GOOS != "windows" && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("waiting past the deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	_ = nc.SetReadDeadline(time.Time{})

	c := &relayConn{Conn: nc}
	if _, err := io.WriteString(peer, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
		t.Fatal(err)
	}
	if err := c.reading(); err != nil || c.br == nil {
		t.Fatalf("reading: %v, buffer %v", err, c.br != nil)
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "ok" {
		t.Fatalf("body %q", b)
	}
	if !c.idle() || c.br != nil {
		t.Errorf("an answer read whole: idle %v, buffer kept %v", c.idle(), c.br != nil)
	}

	if _, err := io.WriteString(peer, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"); err != nil {
		t.Fatal(err)
	}
	if err := c.reading(); err != nil {
		t.Fatal(err)
	}
	resp, err = http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	for c.br.Buffered() == 0 { // EXTRA may come in a later segment
		if _, err := c.br.Peek(1); err != nil {
			t.Fatal(err)
		}
	}
	if c.idle() {
		t.Error("a connection with bytes after its answer was kept for reuse")
	}
}

// writesConn is a connection that keeps what is written to it, one
// element per Write.
type writesConn struct {
	net.Conn
	writes [][]byte
}

func (c *writesConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, append([]byte(nil), p...))
	return len(p), nil
}

// A tunnel's request goes to the model server in one write, head and body
// together, although its body is a stream (issue 25: one write per hop
// for what arrived together); a body larger than the buffer still arrives
// whole and in order, and the server reads the request it was sent.
func TestRelayWritesARequestHeadAndBodyInOneWrite(t *testing.T) {
	for _, size := range []int{120, 5 * relayBufSize} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			body := strings.Repeat("x", size-2) + "\n}"
			// Not a reader net/http knows to be in memory: it flushes the
			// head on its own before such a body.
			stream := io.MultiReader(strings.NewReader(body[:size/2]), strings.NewReader(body[size/2:]))
			req, err := http.NewRequest(http.MethodPost, "http://model:11434/api/chat", stream)
			if err != nil {
				t.Fatal(err)
			}
			req.ContentLength = int64(size)
			req.Header.Set("Content-Type", "application/json")
			c := &writesConn{}
			if err := writeRequest(c, req); err != nil {
				t.Fatal(err)
			}
			if size <= relayBufSize/2 && len(c.writes) != 1 {
				t.Fatalf("%d writes for a %d-byte body, want 1 (head and body together): %q", len(c.writes), size, c.writes)
			}
			got, err := http.ReadRequest(bufio.NewReader(strings.NewReader(string(bytesJoin(c.writes)))))
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(got.Body)
			if err != nil {
				t.Fatal(err)
			}
			if got.URL.Path != "/api/chat" || got.ContentLength != int64(size) || string(b) != body || got.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("the server read %s %s, length %d, type %q, body of %d bytes (equal: %v)",
					got.Method, got.URL.Path, got.ContentLength, got.Header.Get("Content-Type"), len(b), string(b) == body)
			}
		})
	}
}

func bytesJoin(parts [][]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
