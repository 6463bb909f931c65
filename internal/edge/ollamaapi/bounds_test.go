package ollamaapi

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
)

// P3, issue 10 item 1: a body over the limit is refused with 413 before
// it is read, when its length says so, and before more than the limit is
// read when it does not; nothing reaches the runner.
func TestABodyOverTheLimitIsRefusedBeforeItIsRead(t *testing.T) {
	big := `{"model":"m1","prompt":"` + strings.Repeat("a", frontdoor.DefaultMaxRequest) + `"}`
	for _, known := range []bool{true, false} {
		t.Run(fmt.Sprintf("content-length known %v", known), func(t *testing.T) {
			f := &ft.Dispatcher{}
			e := newEnv(t, f)
			read := 0
			r := req(http.MethodPost, "/api/generate", "")
			r.Body = io.NopCloser(readCounter{strings.NewReader(big), &read})
			r.ContentLength = -1
			if known {
				r.ContentLength = int64(len(big))
			}
			w := e.do(r)
			if w.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if known && read != 0 {
				t.Errorf("%d bytes read of a body whose length said it was too large", read)
			}
			if !known && read > frontdoor.DefaultMaxRequest+64<<10 {
				t.Errorf("%d bytes read; the limit is %d", read, frontdoor.DefaultMaxRequest)
			}
			if len(f.Starts()) != 0 {
				t.Error("a too-large request reached the runner")
			}
		})
	}
}

type readCounter struct {
	r io.Reader
	n *int
}

func (c readCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	*c.n += n
	return n, err
}

// P3, issue 10 item 2: a client that stops reading an Ollama stream is
// ended at its idle timeout, though the handler is blocked writing to it,
// and the tunnel (with its provider slot) is released. Real sockets: the
// block is in the kernel.
func TestAClientThatStopsReadingIsEndedAndItsTunnelReleased(t *testing.T) {
	chunk := `{"response":"` + strings.Repeat("x", 32<<10) + `"}`
	pieces := make([]ft.Step, 4096) // 128 MiB if anyone read it
	for i := range pieces {
		pieces[i] = ft.Line(chunk)
	}
	f := &ft.Dispatcher{Idle: time.Second, Pieces: pieces}
	e := newEnv(t, f)
	srv := httptest.NewServer(e.handler)
	defer srv.Close()

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetReadBuffer(4 << 10)
	}
	body := `{"model":"m1","prompt":"hi"}`
	fmt.Fprintf(conn, "POST /api/generate HTTP/1.1\r\nHost: edge\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		testKey, len(body), body)
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(line, "200") {
		t.Fatalf("status line %q: %v", line, err)
	}
	var tun *ft.Tunnel
	deadline := time.Now().Add(5 * time.Second)
	for tun == nil && time.Now().Before(deadline) {
		if tunnels := f.Tunnels(); len(tunnels) == 1 {
			tun = tunnels[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	if tun == nil {
		t.Fatal("no tunnel started")
	}
	select {
	case <-tun.Closed():
	case <-time.After(20 * time.Second):
		t.Fatal("the tunnel of a client that stopped reading was not released 20 s later (idle timeout 1 s)")
	}
	if !tun.CancelledWith(frontend.ErrIdleTimeout) && !tun.CancelledWith(frontend.ErrClientGone) {
		t.Error("the tunnel was not cancelled with the idle timeout or client gone")
	}
}
