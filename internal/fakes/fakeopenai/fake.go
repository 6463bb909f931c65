// Package fakeopenai is a fake OpenAI-compatible HTTP server for tests.
//
// It speaks the wire shapes of /v1/chat/completions (server-sent events of
// chat.completion.chunk objects ending in `data: [DONE]`, or one
// chat.completion object when not streaming), /v1/completions (text
// completions, streamed or not, with suffix), /v1/embeddings (float or
// base64, with dimensions) and /v1/models, with per-model
// knobs: the tokens, the reasoning, the delay between chunks, tool calls
// streamed as fragmented deltas, the finish reason, the usage, a failure
// (an HTTP status with an OpenAI error body, or an error object mid-stream),
// and a stall after N chunks that keeps the connection open until the client
// leaves. With APIKey set, every request must carry `Authorization: Bearer
// <key>` or gets a 401 with an OpenAI-shaped error.
//
// A model can answer as a coding agent's model does (Model.Agent: one tool
// call for a user turn, a quote of the tool's result after it), answers a
// response_format with JSON that fits it, and costs prefill only for the
// prompt tokens the server's prompt cache does not hold
// (Model.PrefillPerToken), reporting them as
// usage.prompt_tokens_details.cached_tokens. Config.Tokenize makes it
// serve vLLM's or llama.cpp's tokenize endpoints, whose counts equal the
// prompt_tokens it reports for the same messages.
//
// The server records every request (headers and body) and when each client
// went away, so tests can check that a cancel reached the server.
package fakeopenai

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakemodel"
)

// Config is the server's behaviour. It may be changed while the server runs
// with Server.Update.
type Config struct {
	// Models are the models the server serves and lists in /v1/models.
	Models []Model
	// APIKey, when set, is the bearer key every request must present.
	APIKey string
	// ModelsFail, when set, makes /v1/models answer with this failure
	// (its Status and error body; MidStream is ignored).
	ModelsFail *Failure
	// ModelsDelay delays the answer of /v1/models.
	ModelsDelay time.Duration
	// Tokenize is the tokenize API the server serves, as the server it
	// pretends to be (default none, as OpenAI's own API).
	Tokenize TokenizeAPI
	// PromptCachePrompts and PromptCacheTokens bound the server's prompt
	// cache (0: fakemodel's defaults). They are read when the server
	// starts.
	PromptCachePrompts int
	PromptCacheTokens  int
}

// Model is one model and the knobs of its answers.
type Model struct {
	// Name is the model id, matched against the request's "model".
	Name string
	// Tokens are the content pieces, one per chunk. When nil, TokenCount
	// words are generated.
	Tokens []string
	// TokenCount is the number of generated words when Tokens is nil
	// (default 5).
	TokenCount int
	// Reasoning are reasoning_content pieces, one per chunk, streamed
	// before the content.
	Reasoning []string
	// HeaderDelay is the wait before the response headers, like a server
	// that answers only once it has started generating.
	HeaderDelay time.Duration
	// PrefillDelay is the wait after the response headers are flushed and
	// before the first chunk (a long prompt prefill).
	PrefillDelay time.Duration
	// Delay is the wait between consecutive chunks.
	Delay time.Duration
	// ToolCalls are streamed after the content, each as fragmented deltas:
	// a first delta with index, id, type and name, then its arguments in
	// pieces of FragmentSize bytes.
	ToolCalls []ToolCall
	// FinishReason is the finish_reason of the last choice chunk. Default
	// "tool_calls" when there are tool calls, "stop" otherwise.
	FinishReason string
	// Usage overrides the reported usage. By default prompt tokens are a
	// word count of the request's messages and completion tokens the number
	// of delta chunks. Streamed usage is sent only when the request asks for
	// it (stream_options.include_usage), as OpenAI does.
	Usage *Usage
	// NoUsage suppresses the usage even when the request asks for it, like
	// a server that does not support it.
	NoUsage bool
	// Fail makes the request fail (see Failure).
	Fail *Failure
	// Stall makes the server stop after StallAfter delta chunks (0: after
	// the headers, before any chunk) and keep the connection open, writing
	// nothing, until the client goes away.
	Stall      bool
	StallAfter int
	// NoSuffix refuses text completions with a suffix, 400 "suffix is not
	// currently supported", as vLLM answers for a model without
	// fill-in-the-middle.
	NoSuffix bool
	// EmbeddingDims is the length of the model's embeddings (default 8).
	EmbeddingDims int
	// Agent, when set, answers chat as a coding agent's model does: one
	// call to a tool the request offers for a turn that asks (honouring
	// tool_choice), a quote of the tool's result for a turn that carries
	// one, the model's own answer (Tokens) without tools; ToolCalls are
	// then not used. See fakemodel.Agent.
	Agent *Agent
	// PrefillPerToken is added to PrefillDelay for every prompt token the
	// server's prompt cache does not hold: the prompt's tokens past its
	// longest common prefix with a prompt the server served recently.
	PrefillPerToken time.Duration
	// ContextLength is the model's context, the max_model_len of vLLM's
	// /tokenize (default 32768).
	ContextLength int
}

// Agent makes a model answer as a coding agent's model does (see
// fakemodel.Agent).
type Agent = fakemodel.Agent

// ToolCall is a tool call the model makes.
type ToolCall struct {
	// ID is the call id; default "call_<index>".
	ID   string
	Name string
	// Arguments is the full JSON text of the arguments.
	Arguments string
	// FragmentSize is the size in bytes of each streamed arguments piece
	// (default 7).
	FragmentSize int
}

// Usage is token accounting as the server reports it.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens is reported as prompt_tokens_details.cached_tokens.
	CachedTokens int
}

// Failure is an error the server answers with, as an OpenAI error body:
// {"error":{"message":...,"type":...,"param":null,"code":...}}.
type Failure struct {
	// Status is the HTTP status, answered before any chunk. Default 500.
	Status  int
	Message string
	// Type is the error type, e.g. "invalid_request_error",
	// "rate_limit_exceeded", "server_error". Default "server_error".
	Type string
	// Code is the error code, or "" for null.
	Code string
	// MidStream makes a streaming answer start as 200, send AfterChunks
	// delta chunks, then `data: {"error":{...}}` and `data: [DONE]`.
	MidStream   bool
	AfterChunks int
}

// Server is a running fake. Its zero value is not usable: use Start.
type Server struct {
	mu      sync.Mutex
	cfg     Config
	records []*record
	changed chan struct{} // closed and replaced on every record change
	nextID  int
	cache   *fakemodel.PromptCache

	srv *httptest.Server
}

// Start starts a server on a loopback port with cfg. Close it when done.
func Start(cfg Config) *Server {
	s := NewUnstarted(cfg)
	s.srv = httptest.NewServer(s)
	return s
}

// NewUnstarted returns a server that is only an http.Handler, for callers
// that serve it themselves. URL and Close are then not usable.
func NewUnstarted(cfg Config) *Server {
	return &Server{cfg: cloneConfig(cfg), changed: make(chan struct{}),
		cache: fakemodel.NewPromptCache(cfg.PromptCachePrompts, cfg.PromptCacheTokens)}
}

// URL is the server's root URL, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string { return s.srv.URL }

// BaseURL is the OpenAI base URL, URL()+"/v1".
func (s *Server) BaseURL() string { return s.srv.URL + "/v1" }

// Close closes client connections and stops the server, waiting for every
// handler to return.
func (s *Server) Close() {
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// Update changes the server's configuration; requests that already started
// keep the configuration they started with. f should replace slices (such
// as a model's Tokens) rather than write into them, since running requests
// may still read the old ones.
func (s *Server) Update(f func(*Config)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.cfg)
	s.cfg = cloneConfig(s.cfg)
}

// ResetPromptCache forgets every prompt served: the next requests prefill
// cold, as after a restart.
func (s *Server) ResetPromptCache() { s.cache.Reset() }

func (s *Server) config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cloneConfig(s.cfg)
}

func cloneConfig(c Config) Config {
	c.Models = append([]Model(nil), c.Models...)
	return c
}

func (c Config) model(name string) (Model, bool) {
	for _, m := range c.Models {
		if m.Name == name {
			return m, true
		}
	}
	return Model{}, false
}

// ServeHTTP serves /v1/chat/completions, /v1/completions, /v1/embeddings
// and /v1/models, and the tokenize API of Config.Tokenize.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := s.begin(r)
	defer s.finish(r, rec)
	cfg := s.config()
	if !authorized(cfg.APIKey, r.Header.Get("Authorization")) {
		writeError(w, http.StatusUnauthorized, unauthorized(r.Header.Get("Authorization")))
		return
	}
	switch {
	case r.URL.Path == "/v1/chat/completions" && r.Method == http.MethodPost:
		s.chat(w, r, rec, cfg)
	case r.URL.Path == "/v1/completions" && r.Method == http.MethodPost:
		s.completions(w, r, rec, cfg)
	case r.URL.Path == "/v1/embeddings" && r.Method == http.MethodPost:
		s.embeddings(w, r, cfg)
	case r.URL.Path == "/v1/models" && r.Method == http.MethodGet:
		s.models(w, r, cfg)
	case r.URL.Path == "/tokenize" && r.Method == http.MethodPost && cfg.Tokenize == TokenizeVLLM:
		s.vllmTokenize(w, r, cfg)
	case r.URL.Path == "/tokenize" && r.Method == http.MethodPost && cfg.Tokenize == TokenizeLlamaCpp:
		s.llamaTokenize(w, r)
	case r.URL.Path == "/apply-template" && r.Method == http.MethodPost && cfg.Tokenize == TokenizeLlamaCpp:
		s.applyTemplate(w, r)
	default:
		writeError(w, http.StatusNotFound, Failure{
			Message: "Invalid URL (" + r.Method + " " + r.URL.Path + ")",
			Type:    "invalid_request_error",
		})
	}
}

func authorized(key, header string) bool {
	return key == "" || header == "Bearer "+key
}

func unauthorized(header string) Failure {
	if header == "" {
		return Failure{
			Message: "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
			Type:    "invalid_request_error",
		}
	}
	return Failure{
		Message: "Incorrect API key provided.",
		Type:    "invalid_request_error",
		Code:    "invalid_api_key",
	}
}

func (s *Server) models(w http.ResponseWriter, r *http.Request, cfg Config) {
	if !sleep(r, cfg.ModelsDelay) {
		return
	}
	if cfg.ModelsFail != nil {
		writeError(w, failStatus(*cfg.ModelsFail), *cfg.ModelsFail)
		return
	}
	type entry struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []entry `json:"data"`
	}{Object: "list", Data: []entry{}}
	for _, m := range cfg.Models {
		list.Data = append(list.Data, entry{ID: m.Name, Object: "model", Created: created, OwnedBy: "fakeopenai"})
	}
	writeJSON(w, http.StatusOK, list)
}

// sleep waits d, or until the client goes away (false).
func sleep(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return r.Context().Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}
