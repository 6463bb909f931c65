package integration

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// A request waiting for its first byte through a tunnel costs the Edge a
// goroutine stack of 8 KiB for its handler, not 16 (P3, issue 25): ten
// thousand of them waiting through a silent prefill are ten thousand such
// stacks, and the Go GC's goal counts them a second time. Go gives a
// goroutine the stack its deepest call needed, in powers of two, and keeps
// it while it waits; the frames from net/http's handler down to the wait
// for the Node's first byte (the front end, the dispatch loop, the QUIC
// read) must stay under 8 KiB, and so must the answer's first write, which
// runs under net/http's own 2.8 KiB frame for the header. The Edge's stack
// memory is read from its own /metrics (go_memstats_stack_inuse_bytes)
// with n requests waiting, and again once their answers have begun.
//
// A normalized run (the OpenAI API here) decodes its request's JSON on the
// handler's goroutine, nested as deep as the body is, so its handler's
// stack is 16 KiB; the README's benchmark table reports that path's figure.
func TestAWaitingTunnelCostsTheEdgeOneSmallStack(t *testing.T) {
	const n = 240
	s := startStackOf(t, n, fakeollama.Model{Name: "slow:latest", PrefillDelay: 3 * time.Second, TokenCount: 3, TokenDelay: 2 * time.Second})
	const chat = `{"model":"slow","messages":[{"role":"user","content":"hi"}]}` // the Ollama API: a tunnel
	before := edgeStacks(t, s.base)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	type result struct {
		status int
		err    error
	}
	first, done := make(chan struct{}, n), make(chan result, n)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer client.CloseIdleConnections()
	for range n {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/api/chat", strings.NewReader(chat))
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				first <- struct{}{}
				done <- result{err: err}
				return
			}
			defer resp.Body.Close()
			buf := make([]byte, 4096)
			_, err = resp.Body.Read(buf)
			first <- struct{}{}
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
			}
			if errors.Is(err, io.EOF) {
				err = nil
			}
			done <- result{status: resp.StatusCode, err: err}
		}()
	}
	// Every request is in the fake's prefill (its generation calls
	// in flight), so each is waiting on the Edge for its head.
	for s.fake.Concurrency().Now < n {
		if ctx.Err() != nil {
			t.Fatalf("%d of %d requests reached the provider", s.fake.Concurrency().Now, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	check := func(when string, now edgeStats) {
		t.Helper()
		per := (now.stack - before.stack) / n
		t.Logf("%d requests %s: the Edge's stacks %.1f → %.1f MiB, %d → %d goroutines: %.1f KiB a request",
			n, when, mib(before.stack), mib(now.stack), before.goroutines, now.goroutines, per/1024)
		// A handler's 8 KiB and net/http's background read of 2 KiB;
		// a handler grown to 16 KiB makes it 18.
		if per > 12<<10 {
			t.Errorf("%s, each request holds %.1f KiB of the Edge's stacks; want at most 12 (an 8 KiB handler and its connection's read)", when, per/1024)
		}
	}
	check("waiting for their first byte", edgeStacks(t, s.base))
	for range n {
		<-first
	}
	check("answering (their first bytes written)", edgeStacks(t, s.base))
	for range n {
		if r := <-done; r.err != nil || r.status != http.StatusOK {
			t.Fatalf("a request ended %d %v", r.status, r.err)
		}
	}
}

// edgeStats is what the Edge's /metrics says of its goroutines.
type edgeStats struct {
	stack      float64 // go_memstats_stack_inuse_bytes
	goroutines int
}

func edgeStacks(t *testing.T, base string) edgeStats {
	t.Helper()
	out := scrapeText(t, base+"/metrics")
	return edgeStats{stack: metricValue(out, "go_memstats_stack_inuse_bytes"), goroutines: int(metricValue(out, "go_goroutines"))}
}

func mib(b float64) float64 { return b / (1 << 20) }
