package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// The fault suite's clients: streamed chats through the OpenAI and the
// Ollama APIs, read the way a client reads them, and what a fault may and
// may not do to them.
// clientAPI is one of the client APIs a stream goes through.
type clientAPI string

const (
	openAI clientAPI = "openai" // POST /v1/chat/completions, SSE
	ollama clientAPI = "ollama" // POST /api/chat, NDJSON (the raw provider tunnel)
)

// streamResult is what a client saw of one streamed chat.
type streamResult struct {
	api     clientAPI
	status  int
	content string
	// errMsg is the error the API reported: an OpenAI error event or an
	// Ollama error line in the stream, or the error body of a non-200.
	errMsg string
	// done: the stream ended with its normal terminal and no error (an
	// OpenAI [DONE] without an error event; an Ollama "done":true line).
	done bool
	// terminated: the stream ended with [DONE] or an Ollama terminal line
	// (done or error), i.e. not silently.
	terminated bool
	// err is a transport error: the connection broke or the bound passed.
	err   error
	took  time.Duration
	ended time.Time
}

func (r streamResult) String() string {
	return fmt.Sprintf("%s: status %d, content %q, error %q, done %v, terminated %v, transport error %v, after %.1fs",
		r.api, r.status, clip(r.content, 60), r.errMsg, r.done, r.terminated, r.err, r.took.Seconds())
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// servedBy returns the Node whose fake answered the fast model.
func (r streamResult) servedBy() string {
	id, _, _ := strings.Cut(r.content, " says ")
	return id
}

// stream sends one streamed chat for model through a, bounded by within;
// first, when not nil, is closed once content has arrived.
func (f *faultFleet) stream(a clientAPI, model string, within time.Duration, first chan<- struct{}) streamResult {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	began := time.Now()
	r := streamResult{api: a}
	path := "/v1/chat/completions"
	if a == ollama {
		path = "/api/chat"
	}
	body := fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, model)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.err, r.ended = err, time.Now()
		r.took = r.ended.Sub(began)
		return r
	}
	defer resp.Body.Close()
	r.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		b, err := io.ReadAll(resp.Body)
		r.errMsg, r.err, r.ended = strings.TrimSpace(string(b)), err, time.Now()
		r.took = r.ended.Sub(began)
		return r
	}
	gotFirst := func() {
		if first != nil {
			close(first)
			first = nil
		}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if a == openAI {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			if data == "[DONE]" {
				r.terminated = true
				continue
			}
			var ev struct {
				Choices []struct {
					Delta struct{ Content string }
				}
				Error *struct{ Message, Code, Type string }
			}
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				r.errMsg = "unparsable SSE data: " + data
				continue
			}
			if ev.Error != nil {
				r.errMsg = ev.Error.Code + ": " + ev.Error.Message
				continue
			}
			for _, c := range ev.Choices {
				r.content += c.Delta.Content
			}
		} else {
			if strings.TrimSpace(line) == "" {
				continue
			}
			var ev struct {
				Message struct{ Content string }
				Done    bool
				Error   *string
			}
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				r.errMsg = "unparsable NDJSON line: " + line
				continue
			}
			if ev.Error != nil {
				r.errMsg, r.terminated = *ev.Error, true
				continue
			}
			r.content += ev.Message.Content
			if ev.Done {
				r.done, r.terminated = true, true
			}
		}
		if r.content != "" {
			gotFirst()
		}
	}
	r.err, r.ended = sc.Err(), time.Now()
	r.took = r.ended.Sub(began)
	if a == openAI {
		r.done = r.terminated && r.errMsg == ""
	} else if r.errMsg != "" {
		r.done = false
	}
	return r
}

// inFlight is a stream started in the background.
type inFlight struct {
	first  chan struct{}
	result chan streamResult
}

// startStream starts a stream in the background and waits until content
// has arrived, so that a fault hits it mid-answer.
func (f *faultFleet) startStream(a clientAPI, model string, within time.Duration) *inFlight {
	f.t.Helper()
	s := &inFlight{first: make(chan struct{}), result: make(chan streamResult, 1)}
	go func() { s.result <- f.stream(a, model, within, s.first) }()
	select {
	case <-s.first:
	case r := <-s.result:
		f.t.Fatalf("the %s stream of %s ended before the fault: %v", a, model, r)
	case <-time.After(requestWithin):
		f.t.Fatalf("the %s stream of %s produced nothing within %v", a, model, requestWithin)
	}
	return s
}

// wait returns the stream's result; a stream still open after within is a
// hang and ends the test.
func (s *inFlight) wait(t *testing.T, within time.Duration, what string) streamResult {
	t.Helper()
	select {
	case r := <-s.result:
		return r
	case <-time.After(within):
		t.Fatalf("%s: the stream did not end within %v: a hang", what, within)
		return streamResult{}
	}
}

// assertStreamError checks that a stream cut by a fault ended with an
// error in its API's own form after the content it got: for OpenAI an
// error event then [DONE], for Ollama an {"error": ...} line. Never a
// clean end, never a silent one.
func assertStreamError(t *testing.T, what string, r streamResult, wantInMsg string) {
	t.Helper()
	switch {
	case r.status != http.StatusOK:
		t.Errorf("%s: the stream had started, yet %v", what, r)
	case r.done:
		t.Errorf("%s: the stream ended cleanly (a silent wrong): %v", what, r)
	case r.errMsg == "" || !r.terminated:
		t.Errorf("%s: the stream ended without an error in the %s form: %v", what, r.api, r)
	case r.err != nil && !errors.Is(r.err, io.EOF):
		t.Errorf("%s: the stream ended with a transport error, not the API's error: %v", what, r)
	case wantInMsg != "" && !strings.Contains(r.errMsg, wantInMsg):
		t.Errorf("%s: the stream's error %q does not say %q", what, r.errMsg, wantInMsg)
	default:
		t.Logf("%s: %v", what, r)
	}
}

// assertServedBy sends a streamed chat for the fast model through each
// API, n times, and checks every one completes, answered by node want.
func (f *faultFleet) assertServedBy(want string, n int, during string) {
	f.t.Helper()
	for i := range n {
		for _, a := range []clientAPI{openAI, ollama} {
			r := f.stream(a, fastModel, requestWithin, nil)
			if !r.done || r.servedBy() != want {
				f.t.Errorf("%s: request %d through %s: want a complete answer from %s, got %v", during, i, a, want, r)
			}
		}
	}
}

// assertBothServe checks that n1 and n2 share the fast model again: equal
// Nodes take ties in turn (the fleet routes by free capacity alone, not
// warm first), so a few requests reach both.
func (f *faultFleet) assertBothServe(during string) {
	f.t.Helper()
	seen := map[string]int{}
	for i := range 6 {
		a := []clientAPI{openAI, ollama}[i%2]
		r := f.stream(a, fastModel, requestWithin, nil)
		if !r.done {
			f.t.Errorf("%s: request %d through %s: %v", during, i, a, r)
		}
		seen[r.servedBy()]++
	}
	if seen["n1"] == 0 || seen["n2"] == 0 {
		f.t.Errorf("%s: 6 requests were served by %v, want both n1 and n2", during, seen)
	}
}

func signalProc(t *testing.T, p *proc, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to %s: %v", sig, p.name, err)
	}
}
