package ollama

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/sdk"
)

// sink records a run's events. onEvent, when set, sees each one as it is
// sent (tests use it to cancel mid-stream).
type sink struct {
	mu      sync.Mutex
	events  []sdk.Event
	onEvent func(sdk.Event)
	err     error // returned by Send, to play a host that has gone
}

func (s *sink) Send(ctx context.Context, ev sdk.Event) error {
	if err := ctx.Err(); err != nil {
		return sdk.ErrHostGone
	}
	s.mu.Lock()
	s.events = append(s.events, ev)
	err, f := s.err, s.onEvent
	s.mu.Unlock()
	if f != nil {
		f(ev)
	}
	return err
}

func (s *sink) all() []sdk.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sdk.Event(nil), s.events...)
}

// text joins the Text of the events of kind k.
func (s *sink) text(k sdk.EventKind) string {
	var b strings.Builder
	for _, ev := range s.all() {
		if ev.Kind == k {
			b.WriteString(ev.Text)
		}
	}
	return b.String()
}

func (s *sink) calls() []sdk.ToolCall {
	var out []sdk.ToolCall
	for _, ev := range s.all() {
		if ev.Kind == sdk.ToolCallDelta {
			out = append(out, *ev.ToolCall)
		}
	}
	return out
}

func newFake(t *testing.T, models ...fakeollama.Model) *fakeollama.Server {
	t.Helper()
	f := fakeollama.New(models...)
	t.Cleanup(f.Close)
	return f
}

// newAdapter returns an adapter configured for base with the extra config
// keys in cfg.
func newAdapter(t *testing.T, base string, cfg map[string]any) *Adapter {
	t.Helper()
	c := map[string]any{"base_url": base}
	for k, v := range cfg {
		c[k] = v
	}
	a := New()
	if err := a.Configure(context.Background(), sdk.MustConfig(c)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	return a
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func userRun(target string) *sdk.Request {
	return &sdk.Request{RunID: "run-1", Target: target, Messages: []sdk.Message{{Role: "user", Content: "hello"}}}
}

// lastRequest returns the fake's most recent request.
func lastRequest(t *testing.T, f *fakeollama.Server) fakeollama.Request {
	t.Helper()
	reqs := f.Requests()
	if len(reqs) == 0 {
		t.Fatal("the fake received nothing")
	}
	return reqs[len(reqs)-1]
}

// tunnelRecorder is a TunnelResponse that timestamps every write.
type tunnelRecorder struct {
	mu     sync.Mutex
	status int
	header http.Header
	heads  int
	writes [][]byte
	at     []time.Time
}

func (r *tunnelRecorder) WriteHeader(status int, h http.Header) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.heads++
	r.status, r.header = status, h
	return nil
}

func (r *tunnelRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.heads == 0 {
		return 0, errors.New("write before WriteHeader")
	}
	r.writes = append(r.writes, append([]byte(nil), p...))
	r.at = append(r.at, time.Now())
	return len(p), nil
}

func (r *tunnelRecorder) body() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b []byte
	for _, w := range r.writes {
		b = append(b, w...)
	}
	return b
}

// scripted is an Ollama of the test's own: it records each request's body
// and answers it with answer(n, body), n counting from 0: a status and
// the NDJSON (or error) body.
type scripted struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []string
}

func newScripted(t *testing.T, answer func(n int, body string) (int, string)) *scripted {
	t.Helper()
	s := &scripted{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.bodies)
		s.bodies = append(s.bodies, string(b))
		s.mu.Unlock()
		status, out := answer(n, string(b))
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(status)
		io.WriteString(w, out)
	}))
	t.Cleanup(s.Close)
	return s
}

// sent returns the bodies received so far.
func (s *scripted) sent() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bodies...)
}

// answerLines is a streamed chat answer of content pieces, then its done
// line with reason.
func answerLines(reason string, pieces ...string) string {
	var b strings.Builder
	for _, p := range pieces {
		line, _ := json.Marshal(map[string]any{"message": map[string]string{"role": "assistant", "content": p}, "done": false})
		b.Write(line)
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, `{"message":{"role":"assistant","content":""},"done":true,"done_reason":%q,"prompt_eval_count":7,"eval_count":5}`+"\n", reason)
	return b.String()
}
