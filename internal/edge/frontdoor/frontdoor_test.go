package frontdoor

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func post(body string, knownLength bool) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	if !knownLength {
		r.ContentLength = -1
	}
	return r
}

// P3: bodies are read whole within the endpoint's cap, by their length or
// chunk by chunk, and a body past the cap is ErrTooLarge (413).
func TestReadBodyReadsWithinTheCap(t *testing.T) {
	d := New(Limits{}, nil)
	for _, known := range []bool{true, false} {
		body := strings.Repeat("x", 200<<10)
		b, err := d.ReadBody(httptest.NewRecorder(), post(body, known), "app", 1<<20)
		if err != nil || string(b.Bytes) != body {
			t.Fatalf("known length %v: %v, %d bytes", known, err, len(b.Bytes))
		}
		b.Release()
		_, err = d.ReadBody(httptest.NewRecorder(), post(body, known), "app", 100<<10)
		var be *BodyError
		if !errors.As(err, &be) || !errors.Is(err, ErrTooLarge) || be.Status != http.StatusRequestEntityTooLarge {
			t.Fatalf("known length %v, over the cap: %v", known, err)
		}
	}
}

// P3: the bodies held at once fit in BodyMemory. A body that finds no room
// waits BodyWait, then is refused with ErrBusy (503 with Retry-After); a
// released body makes room; the refusal is counted.
func TestBodiesHeldAtOnceFitTheBodyMemory(t *testing.T) {
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refusals"}, []string{"kind"})
	d := New(Limits{BodyMemory: 1 << 20, BodyWait: 50 * time.Millisecond}, NewRefusals(nil, counter))
	held, err := d.ReadBody(httptest.NewRecorder(), post(strings.Repeat("a", 700<<10), true), "alice", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for _, known := range []bool{true, false} {
		_, err = d.ReadBody(httptest.NewRecorder(), post(strings.Repeat("b", 500<<10), known), "bob", 1<<20)
		var be *BodyError
		if !errors.As(err, &be) || !errors.Is(err, ErrBusy) || be.Status != http.StatusServiceUnavailable || be.RetryAfter <= 0 {
			t.Fatalf("known length %v: a body past the memory left: %v", known, err)
		}
	}
	if n := testutil.ToFloat64(counter.WithLabelValues("body_memory")); n != 2 {
		t.Errorf("body_memory refusals counted %v, want 2", n)
	}
	held.Release()
	held.Release() // twice is harmless
	b, err := d.ReadBody(httptest.NewRecorder(), post(strings.Repeat("b", 500<<10), true), "bob", 1<<20)
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	b.Release()
	// A body larger than all the memory is too large, not busy.
	if _, err := d.ReadBody(httptest.NewRecorder(), post(strings.Repeat("c", 2<<20), true), "carol", 4<<20); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a body larger than BodyMemory: %v", err)
	}
}

// P3, issue 10 item 6: connections past MaxConns are closed as they are
// accepted, counted, and logged at most once per interval; closing one
// makes room.
func TestConnectionsPastTheCapAreClosed(t *testing.T) {
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refusals"}, []string{"kind"})
	var log bytes.Buffer
	d := New(Limits{MaxConns: 2}, NewRefusals(slog.New(slog.NewTextHandler(&log, nil)), counter))
	ln, err := d.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srv := d.Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), slog.New(slog.DiscardHandler))
	go srv.Serve(ln)
	defer srv.Close()

	var open []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	waitFor(t, "two connections counted", func() bool { return d.Conns() == 2 })
	for range 5 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			continue
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err == nil || n != 0 {
			t.Errorf("a connection past the cap was kept open (read %d, %v)", n, err)
		}
		c.Close()
	}
	if n := testutil.ToFloat64(counter.WithLabelValues("http_connections")); n != 5 {
		t.Errorf("refused connections counted %v, want 5", n)
	}
	if lines := strings.Count(log.String(), "connection limit"); lines != 1 {
		t.Errorf("%d log lines for 5 refusals in a burst, want 1:\n%s", lines, log.String())
	}
	open[0].Close()
	waitFor(t, "the closed connection uncounted", func() bool { return d.Conns() == 1 })
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatalf("a request after a connection closed: %v", err)
	}
	resp.Body.Close()
}

// P3, issue 10 item 6: a connection that sends half a header, or nothing
// after a request, is closed by the server's timeouts.
func TestSlowAndIdleConnectionsAreClosed(t *testing.T) {
	d := New(Limits{ReadHeaderTimeout: 200 * time.Millisecond, IdleTimeout: 300 * time.Millisecond}, nil)
	ln, err := d.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := d.Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), slog.New(slog.DiscardHandler))
	go srv.Serve(ln)
	defer srv.Close()

	slow, _ := net.Dial("tcp", ln.Addr().String())
	defer slow.Close()
	io.WriteString(slow, "GET / HTTP/1.1\r\nHost: x\r\n") // never finished
	idle, _ := net.Dial("tcp", ln.Addr().String())
	defer idle.Close()
	io.WriteString(idle, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	for name, c := range map[string]net.Conn{"slow header": slow, "idle keep-alive": idle} {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := io.ReadAll(c) // until the server closes it
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Errorf("%s: still open after 10 s", name)
		}
	}
	waitFor(t, "connections uncounted", func() bool { return d.Conns() == 0 })
}

// P3: a body that does not arrive within BodyTimeout is ErrSlowBody (408).
func TestASlowBodyTimesOut(t *testing.T) {
	d := New(Limits{BodyTimeout: 200 * time.Millisecond}, nil)
	got := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := d.ReadBody(w, r, "app", 1<<20)
		got <- err
	}))
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly part")
	select {
	case err := <-got:
		if !errors.Is(err, ErrSlowBody) {
			t.Fatalf("ReadBody of a stalled body: %v, want ErrSlowBody", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ReadBody of a stalled body did not return")
	}
}

// A flood of one kind of refusal logs one line per interval, with how many
// went unlogged; the counter counts all.
func TestRefusalsAreCountedAndTheirLogThrottled(t *testing.T) {
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refusals"}, []string{"kind"})
	var log bytes.Buffer
	r := NewRefusals(slog.New(slog.NewTextHandler(&log, nil)), counter)
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	for range 3000 {
		r.Refuse("tls_handshake", "refused node connection")
	}
	r.Refuse("registration", "refused registration")
	now = now.Add(RefusalLogInterval)
	r.Refuse("tls_handshake", "refused node connection")
	if n := testutil.ToFloat64(counter.WithLabelValues("tls_handshake")); n != 3001 {
		t.Errorf("counted %v, want 3001", n)
	}
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[2], "not_logged_since_last=2999") {
		t.Errorf("log of 3001 refusals of one kind and one of another:\n%s", log.String())
	}
	var nilRefusals *Refusals
	nilRefusals.Refuse("x", "ignored") // a nil Refusals ignores
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
