package frontdoor

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// detachServer is a real HTTP server behind a door on loopback: POST
// /detach reads its body and detaches (the test answers it from the
// channel, as a detached request's own goroutine does); GET /plain is
// answered by net/http, with the client's address, so that a test can tell
// its connection.
type detachServer struct {
	door     *Door
	addr     string
	detached chan *Detached
}

func startDetachServer(t testing.TB, limits Limits) *detachServer {
	t.Helper()
	s := &detachServer{door: New(limits, nil), detached: make(chan *Detached, 4)}
	ln, err := s.door.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /detach", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			t.Errorf("reading the body: %v", err)
			return
		}
		w.Header().Set("X-Before", "kept")
		dt := s.door.Detach(w, r)
		if dt == nil {
			_, _ = io.WriteString(w, "not detached")
			return
		}
		s.detached <- dt
	})
	mux.HandleFunc("GET /plain", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "plain from "+r.RemoteAddr)
	})
	srv := s.door.Server(mux, slog.New(slog.DiscardHandler))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if err := s.door.WaitDetached(ctx); err != nil {
			t.Errorf("WaitDetached: %v", err)
		}
	})
	return s
}

// client is one raw client connection.
type client struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
}

func (s *detachServer) dial(t *testing.T) *client {
	t.Helper()
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(time.Minute)) // a hung test fails, not hangs
	return &client{t: t, conn: c, br: bufio.NewReader(c)}
}

func (c *client) send(raw string) {
	c.t.Helper()
	if _, err := io.WriteString(c.conn, raw); err != nil {
		c.t.Fatal(err)
	}
}

// read reads one response and its body.
func (c *client) read() (*http.Response, string) {
	c.t.Helper()
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.t.Fatalf("reading a response: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("reading a response's body: %v", err)
	}
	return resp, string(b)
}

// closed reports whether the server closed the connection: a read gets EOF.
func (c *client) closed() bool {
	c.t.Helper()
	_, err := c.br.ReadByte()
	return errors.Is(err, io.EOF)
}

const detachReq = "POST /detach HTTP/1.1\r\nHost: edge\r\nContent-Length: 2\r\n\r\n{}"
const plainReq = "GET /plain HTTP/1.1\r\nHost: edge\r\n\r\n"

// P3: a detached answer streams as HTTP/1.1 chunks, with the headers set
// before Detach, and its connection then serves the client's next request
// (net/http's again), counted by the door all along, and can be detached
// again (its watch, disarmed in the poller's set, armed again).
func TestADetachedAnswerStreamsAndKeepsItsConnection(t *testing.T) {
	s := startDetachServer(t, Limits{})
	c := s.dial(t)
	c.send(detachReq)
	dt := <-s.detached
	if n := s.door.Conns(); n != 1 {
		t.Errorf("a detached connection: the door counts %d connections, want 1", n)
	}
	dt.Header().Set("Content-Type", "application/x-ndjson")
	dt.WriteHeader(http.StatusAccepted)
	_, _ = io.WriteString(dt, "{\"n\":1}\n")
	if err := http.NewResponseController(dt).Flush(); err != nil {
		t.Fatal(err)
	}
	// Between two events the answer holds no write buffer (issue 25: a
	// stream waiting for its next token costs no 4 KiB), and a flush with
	// nothing written is nothing.
	if dt.bw != nil {
		t.Error("the answer holds its write buffer after a flush")
	}
	if err := http.NewResponseController(dt).Flush(); err != nil {
		t.Fatalf("a second flush: %v", err)
	}
	// The first event is on the wire before the answer ends.
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "{\"n\":1}\n" {
		t.Fatalf("first event: %q, %v", line, err)
	}
	if resp.StatusCode != http.StatusAccepted || resp.Header.Get("X-Before") != "kept" ||
		resp.Header.Get("Content-Type") != "application/x-ndjson" || resp.Header.Get("Date") == "" ||
		len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Errorf("response: %d %v %v", resp.StatusCode, resp.TransferEncoding, resp.Header)
	}
	_, _ = io.WriteString(dt, "{\"n\":2}\n")
	dt.Finish()
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "{\"n\":2}\n" {
		t.Fatalf("rest of the body: %q, %v", rest, err)
	}

	local := c.conn.LocalAddr().String()
	c.send(plainReq)
	resp, body := c.read()
	if resp.StatusCode != http.StatusOK || body != "plain from "+local {
		t.Errorf("the next request on the connection: %d %q, want 200 %q", resp.StatusCode, body, "plain from "+local)
	}
	if n := s.door.Conns(); n != 1 {
		t.Errorf("after the answer: the door counts %d connections, want 1", n)
	}
	// And it can be detached again.
	c.send(detachReq)
	dt = <-s.detached
	_, _ = io.WriteString(dt, "again")
	dt.Finish()
	if _, body := c.read(); body != "again" {
		t.Errorf("second detached answer: %q", body)
	}
}

// An answer written whole before Finish goes with its Content-Length and a
// sniffed Content-Type, as net/http's would; one with no body is empty.
func TestADetachedAnswerWrittenWholeHasItsLength(t *testing.T) {
	s := startDetachServer(t, Limits{})
	c := s.dial(t)
	c.send(detachReq)
	dt := <-s.detached
	dt.WriteHeader(http.StatusNotFound)
	_, _ = io.WriteString(dt, `{"error":"model not found"}`)
	dt.Finish()
	resp, body := c.read()
	if resp.StatusCode != http.StatusNotFound || body != `{"error":"model not found"}` || resp.ContentLength != int64(len(body)) ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Errorf("got %d %q, length %d, type %q", resp.StatusCode, body, resp.ContentLength, resp.Header.Get("Content-Type"))
	}

	c.send(detachReq)
	dt = <-s.detached
	dt.WriteHeader(http.StatusNoContent)
	if _, err := io.WriteString(dt, "x"); !errors.Is(err, http.ErrBodyNotAllowed) {
		t.Errorf("a body on 204: %v, want ErrBodyNotAllowed", err)
	}
	dt.Finish()
	if resp, body := c.read(); resp.StatusCode != http.StatusNoContent || body != "" {
		t.Errorf("204: %d %q", resp.StatusCode, body)
	}
	c.send(plainReq)
	if resp, _ := c.read(); resp.StatusCode != http.StatusOK {
		t.Errorf("the connection after a 204: %d", resp.StatusCode)
	}
}

// A client that closes its connection while its detached request waits
// cancels the request's context with ErrClientGone (S5); the connection is
// no longer counted once the answer gives up.
func TestAClientGoneCancelsItsDetachedRequest(t *testing.T) {
	s := startDetachServer(t, Limits{})
	c := s.dial(t)
	c.send(detachReq)
	dt := <-s.detached
	ctx := dt.Request().Context()
	c.conn.Close()
	<-ctx.Done()
	if cause := context.Cause(ctx); !errors.Is(cause, ErrClientGone) {
		t.Errorf("cause %v, want ErrClientGone", cause)
	}
	dt.Finish()
	if n := s.door.Conns(); n != 0 {
		t.Errorf("the door counts %d connections after the client went, want 0", n)
	}
}

// A client that sends its next request before the answer (pipelining) is
// answered in order: the bytes read ahead are the next request's.
func TestANextRequestSentEarlyIsServedAfterTheAnswer(t *testing.T) {
	s := startDetachServer(t, Limits{})
	c := s.dial(t)
	c.send(detachReq + plainReq)
	dt := <-s.detached
	_, _ = io.WriteString(dt, "first")
	dt.Finish()
	if _, body := c.read(); body != "first" {
		t.Errorf("first answer %q", body)
	}
	if resp, body := c.read(); resp.StatusCode != http.StatusOK || !strings.HasPrefix(body, "plain from ") {
		t.Errorf("the request sent early: %d %q", resp.StatusCode, body)
	}
}

// Only a keep-alive HTTP/1.1 request is detached: HTTP/1.0 and
// "Connection: close" stay with net/http, which closes after them.
func TestOnlyAKeepAliveRequestIsDetached(t *testing.T) {
	s := startDetachServer(t, Limits{})
	for _, raw := range []string{
		"POST /detach HTTP/1.0\r\nHost: edge\r\nContent-Length: 2\r\n\r\n{}",
		"POST /detach HTTP/1.1\r\nHost: edge\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
	} {
		c := s.dial(t)
		c.send(raw)
		if _, body := c.read(); body != "not detached" {
			t.Errorf("%q: %q, want it served by net/http", raw, body)
		}
		if !c.closed() {
			t.Errorf("%q: the connection stays open", raw)
		}
	}
	select {
	case dt := <-s.detached:
		dt.Finish()
		t.Error("a request was detached")
	default:
	}
}

// An answer that says Connection: close, or is shorter than its
// Content-Length, closes its connection: nothing else could follow it.
func TestADetachedAnswerThatCannotBeFollowedClosesItsConnection(t *testing.T) {
	s := startDetachServer(t, Limits{})
	c := s.dial(t)
	c.send(detachReq)
	dt := <-s.detached
	dt.Header().Set("Connection", "close")
	_, _ = io.WriteString(dt, "bye")
	dt.Finish()
	if _, body := c.read(); body != "bye" {
		t.Errorf("body %q", body)
	}
	if !c.closed() {
		t.Error("Connection: close: the connection stays open")
	}

	c = s.dial(t)
	c.send(detachReq)
	dt = <-s.detached
	dt.Header().Set("Content-Length", "10")
	_, _ = io.WriteString(dt, "short")
	if _, err := io.WriteString(dt, "toolongnow"); !errors.Is(err, http.ErrContentLength) {
		t.Errorf("a write past Content-Length: %v", err)
	}
	dt.Finish()
	if b, _ := io.ReadAll(c.br); !strings.HasSuffix(string(b), "\r\n\r\nshort") {
		t.Errorf("short body: %q", b)
	}
}

// A connection waiting for its next request after a detached answer is
// closed after the door's IdleTimeout, as net/http closes its own, and
// uncounted.
func TestAnIdleConnectionAfterADetachedAnswerTimesOut(t *testing.T) {
	s := startDetachServer(t, Limits{IdleTimeout: 50 * time.Millisecond})
	c := s.dial(t)
	c.send(detachReq)
	dt := <-s.detached
	dt.Finish()
	c.read()
	if !c.closed() {
		t.Error("the idle connection was not closed")
	}
	for s.door.Conns() != 0 {
		time.Sleep(time.Millisecond) // the close is seen by the server side a moment after the client's
	}
}

// A stopping Edge waits for detached answers, then closes the connections
// idle after them (WaitDetached): net/http's Shutdown does not know them.
func TestWaitDetachedWaitsForAnswersAndClosesIdleConnections(t *testing.T) {
	s := startDetachServer(t, Limits{})
	c := s.dial(t)
	c.send(detachReq)
	dt := <-s.detached

	waited := make(chan error, 1)
	go func() { waited <- s.door.WaitDetached(context.Background()) }()
	select {
	case err := <-waited:
		t.Fatalf("WaitDetached returned before the answer ended: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	_, _ = io.WriteString(dt, "last")
	dt.Finish()
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if _, body := c.read(); body != "last" {
		t.Errorf("body %q", body)
	}
	if !c.closed() {
		t.Error("the idle connection stays open after WaitDetached")
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c = s.dial(t)
	c.send(detachReq)
	dt = <-s.detached
	if err := s.door.WaitDetached(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitDetached past its context: %v", err)
	}
	dt.Finish()
}

// Abort (a detached request's goroutine panicked) cuts the answer off and
// closes the connection, as net/http does for a handler's panic: the
// client never takes what it got for a whole answer.
func TestAnAbortedDetachedAnswerClosesItsConnection(t *testing.T) {
	s := startDetachServer(t, Limits{})
	c := s.dial(t)
	c.send(detachReq)
	dt := <-s.detached
	_, _ = io.WriteString(dt, "{\"n\":1}\n")
	dt.Flush()
	dt.Abort()
	dt.Finish() // nothing more
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(resp.Body); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("an aborted answer read as %q, %v; want it cut off (ErrUnexpectedEOF)", b, err)
	}
	if n := s.door.Conns(); n != 0 {
		t.Errorf("the door counts %d connections, want 0", n)
	}
}

// Issue 25 (P3): a detached request waiting for its answer, and its
// connection idle after it, cost the Edge no goroutine: the connections
// are watched from one (connPoller), and net/http's goroutine for each is
// gone. Fifty waiting, then fifty idle, leave the count where it was.
func TestDetachedConnectionsCostNoGoroutine(t *testing.T) {
	s := startDetachServer(t, Limits{})
	s.detached = make(chan *Detached, 50)
	const n = 50
	settle := func(want int) int {
		t.Helper()
		var got int
		for range 500 { // net/http's goroutines end a moment after their handlers
			if got = runtime.NumGoroutine(); got <= want {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		return got
	}
	warm := s.dial(t) // the poller and the server's own goroutines are up
	warm.send(detachReq)
	dt := <-s.detached
	dt.Finish()
	warm.read()
	base := runtime.NumGoroutine()
	for range 100 { // until the warm-up's handler goroutine has ended
		time.Sleep(20 * time.Millisecond)
		now := runtime.NumGoroutine()
		if now == base {
			break
		}
		base = now
	}

	clients := make([]*client, n)
	dts := make([]*Detached, n)
	for i := range clients {
		clients[i] = s.dial(t)
		clients[i].send(detachReq)
		dts[i] = <-s.detached
	}
	if got := settle(base + 2); got > base+2 {
		t.Errorf("%d requests waiting: %d goroutines, %d before", n, got, base)
	}
	for i, c := range clients {
		_, _ = io.WriteString(dts[i], "ok")
		dts[i].Finish()
		if _, body := c.read(); body != "ok" {
			t.Fatalf("body %q", body)
		}
	}
	if got := settle(base + 2); got > base+2 {
		t.Errorf("%d connections idle after their answers: %d goroutines, %d before", n, got, base)
	}
	for _, c := range clients { // and each still serves its next request
		c.send(plainReq)
		if resp, _ := c.read(); resp.StatusCode != http.StatusOK {
			t.Fatalf("next request: %d", resp.StatusCode)
		}
	}
}
