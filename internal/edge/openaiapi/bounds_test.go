package openaiapi

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
)

// emptyMessages is a chat body of n empty message objects: 3 bytes of JSON
// each, the cheapest way to make a decoder build something.
func emptyMessages(model string, n int) string {
	return `{"model":"` + model + `","messages":[` + strings.Repeat("{},", n-1) + `{}]}`
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// P3, issue 10 item 1: a body over testMaxRequest is refused with 413
// before it is read whole, let alone decoded: not a byte of it when the
// request says its length, no more than the limit when it does not.
func TestABodyOverTheLimitIsRefusedBeforeItIsRead(t *testing.T) {
	big := emptyMessages("m1", testMaxRequest/3+1000)
	for _, known := range []bool{true, false} {
		t.Run(fmt.Sprintf("content-length known %v", known), func(t *testing.T) {
			e := newEnv(t, &ft.Dispatcher{})
			body := &countingReader{r: strings.NewReader(big)}
			r := chatReq("")
			r.Body = io.NopCloser(body)
			r.ContentLength = -1
			if known {
				r.ContentLength = int64(len(big))
			}
			w := e.do(r)
			if w.Code != http.StatusRequestEntityTooLarge || codeOf(apiErrorOf(t, w.Body.String())) != "request_too_large" {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if known && body.n != 0 {
				t.Errorf("%d bytes read of a body whose length said it was too large", body.n)
			}
			if !known && body.n > testMaxRequest+64<<10 {
				t.Errorf("%d bytes read; the limit is %d", body.n, testMaxRequest)
			}
			if len(e.runner.RunRequests()) != 0 {
				t.Error("a too-large request reached the runner")
			}
		})
	}
}

// P3: a body within the size limit that holds more messages than
// MaxMessages is refused at the first message past the bound, with a 400
// naming messages; the decoder never builds the rest.
func TestTooManyMessagesAreRefusedAsTheyAreDecoded(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{})
	w := e.do(chatReq(emptyMessages("m1", testMaxRequest/3-100)))
	b := apiErrorOf(t, w.Body.String())
	if w.Code != http.StatusBadRequest || paramOf(b) != "messages" || !strings.Contains(b.Error.Message, "at most 10000") {
		t.Fatalf("status %d param %q: %s", w.Code, paramOf(b), w.Body)
	}
	for name, body := range map[string]string{
		"content parts": `{"model":"m1","messages":[{"role":"user","content":[` + strings.Repeat(`{"type":"text","text":""},`, MaxContentParts) + `{"type":"text","text":""}]}]}`,
		"tools":         `{"model":"m1","messages":[{"role":"user","content":"x"}],"tools":[` + strings.Repeat(`{},`, MaxTools) + `{}]}`,
	} {
		w := e.do(chatReq(body))
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "Too many") {
			t.Errorf("%s over the bound: status %d: %s", name, w.Code, w.Body)
		}
	}
}

// P3, issue 10 item 1: whether the principal may use the model is decided
// before the messages are decoded: a key without the route is answered 404
// for the largest body without the Edge building a message of it.
func TestTheRouteIsCheckedBeforeTheMessagesAreDecoded(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{ResolveErr: fmt.Errorf("%w: no route", dispatch.ErrForbidden)})
	body := emptyMessages("secret", testMaxRequest/3-100) // too many messages, were they decoded
	allocs := allocBytes(func() {
		w := e.do(chatReq(body))
		if w.Code != http.StatusNotFound || codeOf(apiErrorOf(t, w.Body.String())) != "model_not_found" {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	})
	// The body itself (2 MiB, read from the test's reader) and little else.
	if limit := uint64(3 * testMaxRequest); allocs > limit {
		t.Errorf("a refused request allocated %d bytes, want under %d", allocs, limit)
	}
}

// P3: what one request may make the Edge allocate is bounded by a small
// multiple of the body cap, whatever the body holds. Before the bounds, a
// body of empty messages grew about a hundred times in memory.
func TestTheWorstBodyAllocatesABoundedMultipleOfItsSize(t *testing.T) {
	// A body within the bounds runs: its run answers at once.
	e := newEnv(t, &ft.Dispatcher{Events: []ft.Step{ft.Text("ok"), ft.Completed("stop")}})
	for name, body := range map[string]string{
		"empty messages":       emptyMessages("m1", testMaxRequest/3-100),
		"empty content parts":  `{"model":"m1","messages":[{"role":"user","content":[` + strings.Repeat(`{},`, testMaxRequest/3-100) + `{}]}]}`,
		"empty tool calls":     `{"model":"m1","messages":[{"role":"assistant","tool_calls":[` + strings.Repeat(`{},`, testMaxRequest/3-100) + `{}]}]}`,
		"one very long string": `{"model":"m1","messages":[{"role":"user","content":"` + strings.Repeat("a", testMaxRequest-100) + `"}]}`,
	} {
		allocs := allocBytes(func() { e.do(chatReq(body)) })
		if limit := uint64(12 * testMaxRequest); allocs > limit {
			t.Errorf("%s: %d bytes allocated for a %d-byte body, want under %d", name, allocs, len(body), limit)
		}
	}
}

// allocBytes is how many bytes f allocates on the heap.
func allocBytes(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// BenchmarkWorstCaseBody is the memory bound as allocation per request
// (go test -bench WorstCaseBody -benchmem ./internal/edge/openaiapi): a body of
// testMaxRequest of empty messages, refused at MaxMessages.
func BenchmarkWorstCaseBody(b *testing.B) {
	e := newEnv(&testing.T{}, &ft.Dispatcher{})
	body := emptyMessages("m1", testMaxRequest/3-100)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if w := e.do(chatReq(body)); w.Code != http.StatusBadRequest {
			b.Fatalf("status %d", w.Code)
		}
	}
}

// P3, issue 10 item 2: a client that stops reading a stream is ended at
// its idle timeout, though the handler is blocked writing to it: the write
// has a deadline, so the handler returns and the run (and the provider
// slot it holds) is released. Real sockets: the block is in the kernel.
func TestAClientThatStopsReadingIsEndedAndItsRunReleased(t *testing.T) {
	chunk := strings.Repeat("x", 32<<10)
	steps := make([]ft.Step, 4096) // 128 MiB if anyone read it
	for i := range steps {
		steps[i] = ft.Text(chunk)
	}
	f := &ft.Dispatcher{Idle: time.Second, Events: steps}
	e := newEnv(t, f)
	srv := httptest.NewServer(e.handler)
	defer srv.Close()

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetReadBuffer(4 << 10) // fill the kernel buffers soon
	}
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		testKey, len(streamBody), streamBody)
	// Read the status line, then stop reading.
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(line, "200") {
		t.Fatalf("status line %q: %v", line, err)
	}
	var run *ft.Run
	deadline := time.Now().Add(5 * time.Second)
	for run == nil && time.Now().Before(deadline) {
		if runs := f.Runs(); len(runs) == 1 {
			run = runs[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	if run == nil {
		t.Fatal("no run started")
	}
	select {
	case <-run.Closed():
	case <-time.After(20 * time.Second):
		t.Fatal("the run of a client that stopped reading was not released 20 s later (idle timeout 1 s)")
	}
	if !run.CancelledWith(frontend.ErrIdleTimeout) && !run.CancelledWith(frontend.ErrClientGone) {
		t.Errorf("run cancelled with %v, want the idle timeout or client gone", "something else")
	}
}

var _ = errors.New
