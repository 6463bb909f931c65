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

// A request waiting for its first byte through a tunnel costs the Edge and
// the Node a goroutine stack of 4 KiB each (P3, issue 25): ten thousand of
// them waiting through a silent prefill are ten thousand such stacks on
// each side, and the Go GC's goal counts them a second time. Go gives a
// goroutine the stack its deepest call needed, in powers of two from its
// starting size, and keeps it while it waits; so the deep part of each
// side's way to its wait (the scheduler, the lease, opening the QUIC
// stream and marshalling into it on the Edge; the header's unmarshalling,
// the lease, the dial and the request's write on the Node) runs on a
// goroutine of its own that ends with it (package shallow), and the
// goroutine that waits holds only its own frames: the Edge's from its
// detached request down to the QUIC read, the Node's from the stream's
// accept down to the wait for the model server's first byte. Each side's
// stack memory is read from its own /metrics
// (go_memstats_stack_inuse_bytes) with n requests waiting, and again once
// their answers have begun: writing an answer goes deeper, and a request
// answering may hold 8 KiB on each side.
//
// A normalized run (the OpenAI API here) decodes its request's JSON on the
// handler's goroutine, nested as deep as the body is, so its handler's
// stack is 16 KiB; the README's benchmark table reports that path's figure.
func TestAWaitingTunnelCostsEachSideOneSmallStack(t *testing.T) {
	const n = 240
	s := startStackWithNodeHealth(t, n, fakeollama.Model{Name: "slow:latest", PrefillDelay: 3 * time.Second, TokenCount: 3, TokenDelay: 2 * time.Second})
	const chat = `{"model":"slow","messages":[{"role":"user","content":"hi"}]}` // the Ollama API: a tunnel
	edgeBefore, nodeBefore := goStacks(t, s.base), goStacks(t, s.health)
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
	// in flight), so each is waiting on the Edge and the Node for its head.
	for s.fake.Concurrency().Now < n {
		if ctx.Err() != nil {
			t.Fatalf("%d of %d requests reached the provider", s.fake.Concurrency().Now, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	check := func(side, when string, before, now stackStats, most float64) {
		t.Helper()
		per := (now.stack - before.stack) / n
		t.Logf("%d requests %s: the %s's stacks %.1f → %.1f MiB, %d → %d goroutines: %.1f KiB a request",
			n, when, side, mib(before.stack), mib(now.stack), before.goroutines, now.goroutines, per/1024)
		if per > most {
			t.Errorf("%s, each request holds %.1f KiB of the %s's stacks; want at most %.0f", when, per/1024, side, most/1024)
		}
	}
	// Waiting: a 4 KiB stack on each side (4.1 and 4.7 KiB measured: the
	// runtime starts a goroutine at the average stack in use at the last
	// collection, so a few of the first ones start at 8); 8 KiB or more,
	// had the way to the wait grown the waiting goroutine, fails.
	check("Edge", "waiting for their first byte", edgeBefore, goStacks(t, s.base), 7<<10)
	check("Node", "waiting for their first byte", nodeBefore, goStacks(t, s.health), 7<<10)
	for range n {
		<-first
	}
	// Answering: the write of the answer's first byte may grow each to 8
	// KiB; 16, had the frames under it not been kept small, fails.
	check("Edge", "answering (their first bytes written)", edgeBefore, goStacks(t, s.base), 12<<10)
	check("Node", "answering (their first bytes written)", nodeBefore, goStacks(t, s.health), 12<<10)
	for range n {
		if r := <-done; r.err != nil || r.status != http.StatusOK {
			t.Fatalf("a request ended %d %v", r.status, r.err)
		}
	}
}

// stackStats is what a daemon's /metrics says of its goroutines.
type stackStats struct {
	stack      float64 // go_memstats_stack_inuse_bytes
	goroutines int
}

func goStacks(t *testing.T, base string) stackStats {
	t.Helper()
	out := scrapeText(t, base+"/metrics")
	return stackStats{stack: metricValue(out, "go_memstats_stack_inuse_bytes"), goroutines: int(metricValue(out, "go_goroutines"))}
}

func mib(b float64) float64 { return b / (1 << 20) }
