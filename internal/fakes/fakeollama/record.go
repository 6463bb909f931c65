package fakeollama

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// maxRecordedResponse bounds the response bytes kept per request.
const maxRecordedResponse = 1 << 20

// Request is what the fake received for one request, and how it ended.
type Request struct {
	ID     int64       `json:"id"`
	Method string      `json:"method"`
	Path   string      `json:"path"`
	Query  string      `json:"query,omitempty"`
	Header http.Header `json:"header"`
	// RemoteAddr is the client's address: requests with the same one came
	// over the same connection.
	RemoteAddr string `json:"remote_addr"`
	Body       []byte `json:"body,omitempty"`
	// Model is the body's "model" (or "name"), when it has one.
	Model string    `json:"model,omitempty"`
	Start time.Time `json:"start"`
	// End is when the fake finished with the request; zero while serving.
	End time.Time `json:"end,omitzero"`
	// GoneAt is when the client went away before the fake had finished
	// answering (its request context ended, or a write failed); zero if the
	// answer was complete.
	GoneAt time.Time `json:"gone_at,omitzero"`
	// Status is the status the fake wrote (0 if it wrote none).
	Status int `json:"status,omitempty"`
	// Response is the body the fake wrote, up to 1 MiB.
	Response []byte `json:"response,omitempty"`
	// Format is a chat's or generate's format ("json" or a JSON schema),
	// and Think its think value ("true", "false" or a level), when it has
	// them.
	Format json.RawMessage `json:"format,omitempty"`
	Think  string          `json:"think,omitempty"`
	// PromptTokens is the prompt's length in the fake's tokens (its
	// prompt_eval_count), and CachedTokens how many of them, from the
	// start, the server's prompt cache held; Prefill is the prefill delay
	// the request waited (PrefillDelay, and PrefillPerToken for every token
	// not cached). Ollama reports no cached count: only here it shows.
	PromptTokens int           `json:"prompt_tokens,omitempty"`
	CachedTokens int           `json:"cached_tokens,omitempty"`
	Prefill      time.Duration `json:"prefill,omitempty"`
}

// Decode decodes the request's JSON body into v.
func (r Request) Decode(v any) error {
	if err := json.Unmarshal(r.Body, v); err != nil {
		return fmt.Errorf("fakeollama: request %d body: %w", r.ID, err)
	}
	return nil
}

// Gone reports whether the client went away before the answer was complete.
func (r Request) Gone() bool { return !r.GoneAt.IsZero() }

// record is the live state behind a Request.
type record struct {
	gone chan struct{} // closed when the client goes away early

	mu   sync.Mutex
	req  Request
	done bool
}

func (rec *record) snapshot() Request {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	r := rec.req
	r.Response = append([]byte(nil), r.Response...)
	return r
}

// annotate records what the handler learned of the request.
func (rec *record) annotate(f func(*Request)) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	f(&rec.req)
}

// markGone records that the client went away, unless the answer was
// already complete.
func (rec *record) markGone() {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.done || !rec.req.GoneAt.IsZero() {
		return
	}
	rec.req.GoneAt = time.Now()
	close(rec.gone)
}

// finish records the end of the handler. A handler that returns because its
// request context ended did so because the client went away: the context
// of a request still being answered ends only then.
func (rec *record) finish(ctx context.Context) {
	if ctx.Err() != nil {
		rec.markGone()
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.done = true
	rec.req.End = time.Now()
}

func (s *Server) record(r *http.Request, body []byte) *record {
	var named struct {
		Model string `json:"model"`
		Name  string `json:"name"`
	}
	_ = json.Unmarshal(body, &named)
	model := named.Model
	if model == "" {
		model = named.Name
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	rec := &record{
		gone: make(chan struct{}),
		req: Request{
			ID:         s.nextID,
			Method:     r.Method,
			Path:       r.URL.Path,
			Query:      r.URL.RawQuery,
			Header:     r.Header.Clone(),
			RemoteAddr: r.RemoteAddr,
			Body:       body,
			Model:      model,
			Start:      time.Now(),
		},
	}
	s.records = append(s.records, rec)
	close(s.changed)
	s.changed = make(chan struct{})
	return rec
}

// Requests returns what the fake has received so far, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	recs := append([]*record(nil), s.records...)
	s.mu.Unlock()
	out := make([]Request, len(recs))
	for i, rec := range recs {
		out[i] = rec.snapshot()
	}
	return out
}

// Request returns the request with the given id.
func (s *Server) Request(id int64) (Request, bool) {
	if rec := s.find(id); rec != nil {
		return rec.snapshot(), true
	}
	return Request{}, false
}

// Reset forgets the recorded requests. Ids keep increasing.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.records = nil
}

// WaitForRequests waits until at least n requests are recorded (since the
// last Reset) and returns them.
func (s *Server) WaitForRequests(ctx context.Context, n int) ([]Request, error) {
	for {
		s.mu.Lock()
		have, changed := len(s.records), s.changed
		s.mu.Unlock()
		if have >= n {
			return s.Requests(), nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("fakeollama: waiting for %d requests (have %d): %w", n, have, ctx.Err())
		}
	}
}

// ClientGone returns a channel closed when the client of request id goes
// away before its answer is complete. It returns nil for an unknown id.
func (s *Server) ClientGone(id int64) <-chan struct{} {
	if rec := s.find(id); rec != nil {
		return rec.gone
	}
	return nil
}

// WaitForDisconnect waits until the client of request id goes away and
// returns when it did.
func (s *Server) WaitForDisconnect(ctx context.Context, id int64) (time.Time, error) {
	rec := s.find(id)
	if rec == nil {
		return time.Time{}, fmt.Errorf("fakeollama: no request %d", id)
	}
	select {
	case <-rec.gone:
		return rec.snapshot().GoneAt, nil
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("fakeollama: request %d: client still connected: %w", id, ctx.Err())
	}
}

func (s *Server) find(id int64) *record {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rec := range s.records {
		if rec.req.ID == id {
			return rec
		}
	}
	return nil
}

// recorder is the ResponseWriter handlers write to: it keeps the status and
// the first bytes of the body, and turns a failed write or flush into "the
// client went away".
type recorder struct {
	http.ResponseWriter
	rec *record
}

// WriteHeader records the status and writes it.
func (w *recorder) WriteHeader(status int) {
	w.rec.mu.Lock()
	if w.rec.req.Status == 0 {
		w.rec.req.Status = status
	}
	w.rec.mu.Unlock()
	w.ResponseWriter.WriteHeader(status)
}

// Write records the first bytes of the body and writes them.
func (w *recorder) Write(p []byte) (int, error) {
	w.rec.mu.Lock()
	if w.rec.req.Status == 0 {
		w.rec.req.Status = http.StatusOK
	}
	if room := maxRecordedResponse - len(w.rec.req.Response); room > 0 {
		w.rec.req.Response = append(w.rec.req.Response, p[:min(room, len(p))]...)
	}
	w.rec.mu.Unlock()
	n, err := w.ResponseWriter.Write(p)
	if err != nil {
		w.rec.markGone()
	}
	return n, err
}

// flush sends what was written so far; a failure means the client is gone.
func (w *recorder) flush() error {
	if err := http.NewResponseController(w.ResponseWriter).Flush(); err != nil {
		w.rec.markGone()
		return err
	}
	return nil
}

// written reports whether the response head has been written.
func (w *recorder) written() bool {
	w.rec.mu.Lock()
	defer w.rec.mu.Unlock()
	return w.rec.req.Status != 0
}

// Unwrap lets http.ResponseController reach the connection.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
