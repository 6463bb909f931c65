package fakeopenai

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"
)

// Request is what the server recorded of one request.
type Request struct {
	// Seq numbers requests from 1 in the order they arrived.
	Seq    int
	Method string
	Path   string
	Header http.Header
	Body   []byte
	// Model and Stream are read from a chat request's body.
	Model  string
	Stream bool
	// ReasoningEffort and ResponseFormat are a chat request's
	// reasoning_effort and response_format, when it has them.
	ReasoningEffort string
	ResponseFormat  json.RawMessage
	// PromptTokens is the prompt's length in the fake's tokens (usage's
	// prompt_tokens unless Model.Usage says otherwise), and CachedTokens
	// how many of them, from the start, the server's prompt cache held;
	// Prefill is the prefill delay the request waited (PrefillDelay, and
	// PrefillPerToken for every token not cached).
	PromptTokens int
	CachedTokens int
	Prefill      time.Duration
	// Received is when the request arrived; Finished when its handler
	// returned (zero while it runs).
	Received time.Time
	Finished time.Time
	// ClientGone says the client went away before the answer was
	// complete (a cancel, a closed connection), and GoneAt when the server
	// noticed.
	ClientGone bool
	GoneAt     time.Time
}

type record struct {
	req      Request
	complete bool // the answer was fully written
}

func (s *Server) begin(r *http.Request) *record {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var head struct {
		Model           string          `json:"model"`
		Stream          bool            `json:"stream"`
		ReasoningEffort string          `json:"reasoning_effort"`
		ResponseFormat  json.RawMessage `json:"response_format"`
	}
	_ = json.Unmarshal(body, &head)

	s.mu.Lock()
	s.nextID++
	rec := &record{req: Request{
		Seq:             s.nextID,
		Method:          r.Method,
		Path:            r.URL.Path,
		Header:          r.Header.Clone(),
		Body:            body,
		Model:           head.Model,
		Stream:          head.Stream,
		ReasoningEffort: head.ReasoningEffort,
		ResponseFormat:  head.ResponseFormat,
		Received:        time.Now(),
	}}
	s.records = append(s.records, rec)
	s.notifyLocked()
	s.mu.Unlock()

	// The request context ends when the client goes away, or when the
	// handler returns; only the first, before completion, is a departure.
	context.AfterFunc(r.Context(), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !rec.complete && rec.req.GoneAt.IsZero() {
			rec.req.ClientGone = true
			rec.req.GoneAt = time.Now()
			s.notifyLocked()
		}
	})
	return rec
}

// annotate records what a handler learned of the request.
func (s *Server) annotate(rec *record, f func(*Request)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&rec.req)
	s.notifyLocked()
}

// markComplete records that the answer was fully written, so that the end
// of the request context is not taken for a departing client.
func (s *Server) markComplete(rec *record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec.complete = true
}

func (s *Server) finish(r *http.Request, rec *record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A handler that returns while its client is still there wrote its
	// whole answer (an error body, a list): it is complete.
	if r.Context().Err() == nil {
		rec.complete = true
	}
	rec.req.Finished = time.Now()
	s.notifyLocked()
}

func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Requests returns a snapshot of every recorded request, in arrival order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshotLocked()
}

func (s *Server) snapshotLocked() []Request {
	out := make([]Request, len(s.records))
	for i, r := range s.records {
		out[i] = r.req
		out[i].Header = r.req.Header.Clone()
	}
	return out
}

// Wait blocks until cond holds for the recorded requests, or ctx ends.
func (s *Server) Wait(ctx context.Context, cond func([]Request) bool) ([]Request, error) {
	for {
		s.mu.Lock()
		reqs := s.snapshotLocked()
		changed := s.changed
		s.mu.Unlock()
		if cond(reqs) {
			return reqs, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return reqs, ctx.Err()
		}
	}
}

// WaitGone blocks until the request with sequence number seq has seen its
// client go away, and returns it.
func (s *Server) WaitGone(ctx context.Context, seq int) (Request, error) {
	reqs, err := s.Wait(ctx, func(rs []Request) bool {
		return len(rs) >= seq && rs[seq-1].ClientGone
	})
	if len(reqs) < seq {
		return Request{}, err
	}
	return reqs[seq-1], err
}

// WaitFinished blocks until the handler of request seq has returned.
func (s *Server) WaitFinished(ctx context.Context, seq int) (Request, error) {
	reqs, err := s.Wait(ctx, func(rs []Request) bool {
		return len(rs) >= seq && !rs[seq-1].Finished.IsZero()
	})
	if len(reqs) < seq {
		return Request{}, err
	}
	return reqs[seq-1], err
}
