// Package fakeollama is a fake Ollama server for tests. It speaks Ollama's
// wire shapes exactly (NDJSON lines flushed one by one, a final done line
// with counts and durations, {"error": ...} bodies with Ollama's statuses)
// for /api/chat, /api/generate, /api/embed (and the legacy
// /api/embeddings), /api/tags, /api/show, /api/ps and /api/version, and
// serves models whose behaviour is set by knobs (see Model): answer, pace,
// prefill, stall, failure, tool calls, thinking (with levels), structured
// outputs (format), and a coding agent's turns (Model.Agent). A prompt
// cache per server makes prefill cost only the tokens a recent prompt did
// not share (Model.PrefillPerToken), for session-affinity measurements.
// A Loading makes it hold at most so many models loaded and take a load
// time for one that is not, evicting an idle one as Ollama does (see
// loading.go), for warm-first routing measurements.
//
// The server records every request it receives and when each client went
// away, so tests can check what an adapter sent and that a cancellation
// reached the provider. A server-wide Mode takes it down in the ways a real
// server goes down (503, reset connections, refused connections, hanging).
//
// Tests use New; integration tests run it as its own process with
// ListenAndServe (see cmd/fakeollama) and steer it through a small control
// API under /_fake/ (see control.go).
package fakeollama

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakemodel"
)

// ServerVersion is what /api/version answers: the Ollama release whose wire
// shapes the fake follows.
const ServerVersion = "0.17.4"

// Mode is the server-wide state of the fake.
type Mode int

// Modes. Every mode but ModeUp affects the Ollama API only: the control API
// under /_fake/ keeps answering (except in ModeRefuse, where nothing does).
const (
	// ModeUp serves normally.
	ModeUp Mode = iota
	// ModeUnavailable answers every request 503 {"error": ...}.
	ModeUnavailable
	// ModeReset accepts each request and closes its connection without an
	// answer.
	ModeReset
	// ModeRefuse closes the listener and every open connection: new
	// connections are refused until another mode is set.
	ModeRefuse
	// ModeHang accepts each request and never answers; the connection stays
	// open until the client goes away.
	ModeHang
)

var modeNames = [...]string{"up", "unavailable", "reset", "refuse", "hang"}

// String returns the mode's name, as the control API spells it.
func (m Mode) String() string {
	if int(m) >= 0 && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode_%d", int(m))
}

// MarshalText encodes the mode's name.
func (m Mode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText decodes a mode's name.
func (m *Mode) UnmarshalText(b []byte) error {
	for i, n := range modeNames {
		if n == string(b) {
			*m = Mode(i)
			return nil
		}
	}
	return fmt.Errorf("fakeollama: unknown mode %q", b)
}

// Server is a fake Ollama server listening on a TCP address.
type Server struct {
	addr    string
	started time.Time
	quit    chan struct{} // closed by Close: stalled handlers give up

	mu      sync.Mutex
	closed  bool
	srv     *http.Server  // nil in ModeRefuse and after Close
	served  chan struct{} // closed when srv's Serve returns
	mode    Mode
	models  map[string]Model     // by baseName
	loaded  map[string]time.Time // baseName → expiry, for /api/ps
	records []*record
	nextID  int64
	changed chan struct{} // closed and replaced when a request is recorded
	cache   *fakemodel.PromptCache
	// Model memory (loading.go): how models are held, the models loaded or
	// loading, the counts; turn is held by the one request deciding where
	// its model goes, and freed is closed (and replaced) when a use ends.
	loading  Loading
	resident map[string]*resident
	loads    LoadStats
	turn     chan struct{}
	freed    chan struct{}
	loadsWG  sync.WaitGroup // loads in progress

	gen      meter          // generation requests in flight (concurrency.go)
	handlers sync.WaitGroup // in-flight API requests
	serving  sync.WaitGroup // Serve goroutines
}

// New starts a fake on a free loopback port with the given models. It
// panics if it cannot listen, like httptest.NewServer. Close it when done.
func New(models ...Model) *Server {
	s, err := Listen("127.0.0.1:0", models...)
	if err != nil {
		panic(err)
	}
	return s
}

// Listen starts a fake on addr (host:port; port 0 picks a free one).
func Listen(addr string, models ...Model) (*Server, error) {
	s := newUnlistened(models...)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fakeollama: listen: %w", err)
	}
	s.addr = ln.Addr().String()
	s.mu.Lock()
	s.serveLocked(ln)
	s.mu.Unlock()
	return s, nil
}

// newUnlistened is a fake serving models that listens nowhere yet: its
// ServeHTTP answers as the listening one's does.
func newUnlistened(models ...Model) *Server {
	s := &Server{
		started: time.Now().UTC().Truncate(time.Second),
		quit:    make(chan struct{}),
		models:  make(map[string]Model),
		loaded:  make(map[string]time.Time),
		changed: make(chan struct{}),
		cache:   fakemodel.NewPromptCache(0, 0),
		// Model memory (loading.go).
		resident: make(map[string]*resident),
		turn:     make(chan struct{}, 1),
		freed:    make(chan struct{}),
	}
	for _, m := range models {
		s.models[baseName(m.Name)] = m
	}
	return s
}

// ListenAndServe runs a fake on addr until ctx is done, then closes it.
func ListenAndServe(ctx context.Context, addr string, models ...Model) error {
	s, err := Listen(addr, models...)
	if err != nil {
		return err
	}
	<-ctx.Done()
	s.Close()
	return nil
}

func (s *Server) serveLocked(ln net.Listener) {
	srv := &http.Server{Handler: s, ReadHeaderTimeout: time.Minute}
	s.srv = srv
	done := make(chan struct{})
	s.served = done
	s.serving.Add(1)
	go func() {
		defer s.serving.Done()
		defer close(done)
		_ = srv.Serve(ln) // returns when srv is closed
	}()
}

// stopServingLocked closes the listener and every connection, and waits for
// Serve to return: only then is the listening socket really closed, so that
// a dial right after it is refused rather than reset.
func (s *Server) stopServingLocked() {
	if s.srv == nil {
		return
	}
	_ = s.srv.Close()
	<-s.served
	s.srv = nil
}

// URL is the server's base URL, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string { return "http://" + s.addr }

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.addr }

// Close stops the server: it closes every connection, ends stalled and
// hanging requests, and waits for all handlers to return.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.quit)
	s.stopServingLocked()
	s.mu.Unlock()
	s.handlers.Wait()
	s.serving.Wait()
	s.loadsWG.Wait()
}

// SetMode switches the server-wide mode. Leaving ModeRefuse listens again on
// the same address, which fails only if another process took the port.
func (s *Server) SetMode(mode Mode) error {
	if mode < ModeUp || mode > ModeHang {
		return fmt.Errorf("fakeollama: unknown mode %d", int(mode))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("fakeollama: server closed")
	}
	switch {
	case mode == ModeRefuse:
		s.stopServingLocked()
	case mode != ModeRefuse && s.srv == nil:
		ln, err := net.Listen("tcp", s.addr)
		if err != nil {
			return fmt.Errorf("fakeollama: listen again: %w", err)
		}
		s.serveLocked(ln)
	}
	s.mode = mode
	return nil
}

// Mode returns the server-wide mode.
func (s *Server) Mode() Mode {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mode
}

// SetModel adds m, or replaces the model of the same name. Requests already
// being served keep the knobs they started with.
func (s *Server) SetModel(m Model) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.models[baseName(m.Name)] = m
}

// RemoveModel removes the model name (with or without ":latest").
func (s *Server) RemoveModel(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.models, baseName(name))
	delete(s.loaded, baseName(name))
	delete(s.resident, baseName(name))
}

// SetPromptCache replaces the server's prompt cache with an empty one that
// remembers at most prompts prompts and tokens tokens (0: the defaults,
// fakemodel.DefaultCachePrompts and DefaultCacheTokens). A real server's
// cache is as large as its KV memory; a small one shows eviction.
func (s *Server) SetPromptCache(prompts, tokens int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cache = fakemodel.NewPromptCache(prompts, tokens)
}

// ResetPromptCache forgets every prompt served: the next requests prefill
// cold, as after a restart.
func (s *Server) ResetPromptCache() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cache.Reset()
}

// serveCache looks prompt up in the prompt cache under model and remembers
// it; it returns how many of its first tokens were cached.
func (s *Server) serveCache(model string, prompt fakemodel.Tokens) int {
	s.mu.Lock()
	c := s.cache
	s.mu.Unlock()
	return c.Serve(baseName(model), prompt)
}

// Models returns the registered models, sorted by name.
func (s *Server) Models() []Model {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Model, 0, len(s.models))
	for _, m := range s.models {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (s *Server) model(name string) (Model, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.models[baseName(name)]
	return m, ok
}

// markLoaded records that m was used, for /api/ps, with Ollama's keep_alive
// rule: default 5 minutes, 0 unloads, negative keeps it forever.
func (s *Server) markLoaded(m Model, keepAlive time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := baseName(m.Name)
	if keepAlive == 0 {
		delete(s.loaded, key)
		return
	}
	s.loaded[key] = time.Now().Add(keepAlive).UTC()
}

// sleep waits d, or until ctx is done or the server closes (false).
func (s *Server) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-s.quit:
		return false
	}
}

// hang waits until the client goes away or the server closes.
func (s *Server) hang(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-s.quit:
	}
}
