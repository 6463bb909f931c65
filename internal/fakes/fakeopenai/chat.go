package fakeopenai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/iop-dev/iop/internal/fakes/fakemodel"
)

// created is the fixed "created" timestamp of every object, so that answers
// are reproducible.
const created = 1700000000

// chatRequest is the part of a chat request the fake reads.
type chatRequest struct {
	Model         string        `json:"model"`
	Messages      []chatMessage `json:"messages"`
	Stream        bool          `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Tools          []chatTool      `json:"tools"`
	ToolChoice     json.RawMessage `json:"tool_choice"`
	ResponseFormat json.RawMessage `json:"response_format"`
}

// chatMessage is one message of a chat request. Content is a string, an
// array of parts, or null (an assistant's tool calls).
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// chatTool is a tool of a chat request; only function tools are read.
type chatTool struct {
	Type     string `json:"type"`
	Function struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// Wire shapes of the answers.
type (
	wireToolFunction struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	}
	wireToolCall struct {
		Index    *int             `json:"index,omitempty"`
		ID       string           `json:"id,omitempty"`
		Type     string           `json:"type,omitempty"`
		Function wireToolFunction `json:"function"`
	}
	wireDelta struct {
		Role             string         `json:"role,omitempty"`
		Content          *string        `json:"content,omitempty"`
		ReasoningContent *string        `json:"reasoning_content,omitempty"`
		ToolCalls        []wireToolCall `json:"tool_calls,omitempty"`
	}
	wireChunkChoice struct {
		Index        int       `json:"index"`
		Delta        wireDelta `json:"delta"`
		Logprobs     *struct{} `json:"logprobs"`
		FinishReason *string   `json:"finish_reason"`
	}
	wireUsage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
		// PromptTokensDetails carries the cached prefix of a chat or text
		// completion, as OpenAI (and llama.cpp) report it.
		PromptTokensDetails *wirePromptDetails `json:"prompt_tokens_details,omitempty"`
	}
	wirePromptDetails struct {
		CachedTokens int `json:"cached_tokens"`
	}
	wireChunk struct {
		ID      string            `json:"id"`
		Object  string            `json:"object"`
		Created int64             `json:"created"`
		Model   string            `json:"model"`
		Choices []wireChunkChoice `json:"choices"`
		// Usage is null on every chunk but the last when usage was asked
		// for, and absent otherwise, as OpenAI sends it.
		Usage *json.RawMessage `json:"usage,omitempty"`
	}
	wireMessage struct {
		Role             string         `json:"role"`
		Content          *string        `json:"content"`
		ReasoningContent string         `json:"reasoning_content,omitempty"`
		ToolCalls        []wireToolCall `json:"tool_calls,omitempty"`
	}
	wireCompletion struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices []struct {
			Index        int         `json:"index"`
			Message      wireMessage `json:"message"`
			Logprobs     *struct{}   `json:"logprobs"`
			FinishReason string      `json:"finish_reason"`
		} `json:"choices"`
		Usage wireUsage `json:"usage"`
	}
)

var vocabulary = []string{"The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "again"}

// tokens returns the content pieces of m.
func (m Model) tokens() []string {
	if m.Tokens != nil {
		return m.Tokens
	}
	n := m.TokenCount
	if n == 0 {
		n = 5
	}
	out := make([]string, n)
	for i := range out {
		w := vocabulary[i%len(vocabulary)]
		if i > 0 {
			w = " " + w
		}
		out[i] = w
	}
	return out
}

// deltas returns the delta chunks of m's answer, in order: reasoning,
// content, then tool-call fragments.
func (m Model) deltas() []wireDelta {
	var out []wireDelta
	for _, r := range m.Reasoning {
		out = append(out, wireDelta{ReasoningContent: &r})
	}
	for _, t := range m.tokens() {
		out = append(out, wireDelta{Content: &t})
	}
	for i, tc := range m.ToolCalls {
		out = append(out, wireDelta{ToolCalls: []wireToolCall{{
			Index: &i, ID: tc.id(i), Type: "function",
			Function: wireToolFunction{Name: tc.Name},
		}}})
		size := tc.FragmentSize
		if size <= 0 {
			size = 7
		}
		for args := tc.Arguments; args != ""; {
			n := min(size, len(args))
			out = append(out, wireDelta{ToolCalls: []wireToolCall{{
				Index: &i, Function: wireToolFunction{Arguments: args[:n]},
			}}})
			args = args[n:]
		}
	}
	return out
}

func (tc ToolCall) id(i int) string {
	if tc.ID != "" {
		return tc.ID
	}
	return fmt.Sprintf("call_%d", i)
}

func (m Model) finishReason() string {
	switch {
	case m.FinishReason != "":
		return m.FinishReason
	case len(m.ToolCalls) > 0:
		return "tool_calls"
	}
	return "stop"
}

// usage is m's usage for a prompt of prompt tokens of which cached were in
// the prompt cache, unless m.Usage says otherwise.
func (m Model) usage(prompt, cached int) wireUsage {
	u := wireUsage{PromptTokens: prompt, CompletionTokens: len(m.deltas()),
		PromptTokensDetails: &wirePromptDetails{CachedTokens: cached}}
	if m.Usage != nil {
		u = wireUsage{PromptTokens: m.Usage.PromptTokens, CompletionTokens: m.Usage.CompletionTokens,
			PromptTokensDetails: &wirePromptDetails{CachedTokens: m.Usage.CachedTokens}}
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request, rec *record, cfg Config) {
	var req chatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, Failure{
			Message: "We could not parse the JSON body of your request.",
			Type:    "invalid_request_error",
		})
		return
	}
	if len(req.Messages) == 0 {
		writeError(w, http.StatusBadRequest, Failure{
			Message: "[] is too short - 'messages'",
			Type:    "invalid_request_error",
		})
		return
	}
	m, ok := cfg.model(req.Model)
	if !ok {
		writeError(w, http.StatusNotFound, Failure{
			Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", req.Model),
			Type:    "invalid_request_error",
			Code:    "model_not_found",
		})
		return
	}
	m, err := m.respond(req)
	if err != nil {
		// A request the model cannot answer (a forced tool not offered, a
		// schema it cannot follow) is the client's error, as on vLLM.
		writeError(w, http.StatusBadRequest, Failure{Message: err.Error(), Type: "invalid_request_error"})
		return
	}
	if !sleep(r, m.HeaderDelay) {
		return
	}
	if m.Fail != nil && (!m.Fail.MidStream || !req.Stream) {
		writeError(w, failStatus(*m.Fail), *m.Fail)
		return
	}
	var tokens fakemodel.Tokens
	for _, msg := range req.Messages {
		tokens = tokens.AppendText(messageText(msg.Content))
	}
	m, cached := s.prefill(rec, m, tokens)
	usage := m.usage(len(tokens), cached)
	if req.Stream {
		s.stream(w, r, rec, m, chatAnswer(m, req, usage))
		return
	}
	s.complete(w, r, m, usage)
}

// prefill looks the prompt's tokens up in the prompt cache, and returns m
// with its prefill delay for the tokens not cached, and how many were
// cached; it records the counts.
func (s *Server) prefill(rec *record, m Model, tokens fakemodel.Tokens) (Model, int) {
	cached := s.cache.Serve(m.Name, tokens)
	m.PrefillDelay = fakemodel.Prefill(m.PrefillDelay, m.PrefillPerToken, len(tokens), cached)
	s.annotate(rec, func(r *Request) { r.PromptTokens, r.CachedTokens, r.Prefill = len(tokens), cached, m.PrefillDelay })
	return m, cached
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request, m Model, usage wireUsage) {
	if m.Stall {
		<-r.Context().Done()
		return
	}
	if !sleep(r, m.PrefillDelay) {
		return
	}
	var out wireCompletion
	out.ID, out.Object, out.Created, out.Model = "chatcmpl-fake", "chat.completion", created, m.Name
	out.Choices = make([]struct {
		Index        int         `json:"index"`
		Message      wireMessage `json:"message"`
		Logprobs     *struct{}   `json:"logprobs"`
		FinishReason string      `json:"finish_reason"`
	}, 1)
	c := &out.Choices[0]
	c.Message.Role = "assistant"
	c.FinishReason = m.finishReason()
	if text := strings.Join(m.tokens(), ""); text != "" || len(m.ToolCalls) == 0 {
		c.Message.Content = &text
	}
	c.Message.ReasoningContent = strings.Join(m.Reasoning, "")
	for i, tc := range m.ToolCalls {
		c.Message.ToolCalls = append(c.Message.ToolCalls, wireToolCall{
			ID: tc.id(i), Type: "function",
			Function: wireToolFunction{Name: tc.Name, Arguments: tc.Arguments},
		})
	}
	out.Usage = usage
	writeJSON(w, http.StatusOK, out)
}

// sseAnswer is an answer stream writes: n delta chunks, then the final
// chunk and, if usage is not nil, the usage chunk.
type sseAnswer struct {
	n     int
	delta func(i int) any // the i-th delta chunk
	final func() any
	usage func() any
}

// chatAnswer is m's chat answer to req as chunks, ending in usage when
// the request asks for it.
func chatAnswer(m Model, req chatRequest, usage wireUsage) sseAnswer {
	includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	chunk := func(d wireDelta, finish *string) wireChunk {
		c := wireChunk{
			ID: "chatcmpl-fake", Object: "chat.completion.chunk", Created: created, Model: m.Name,
			Choices: []wireChunkChoice{{Delta: d, FinishReason: finish}},
		}
		if includeUsage {
			null := json.RawMessage("null")
			c.Usage = &null
		}
		return c
	}
	deltas := m.deltas()
	a := sseAnswer{
		n: len(deltas),
		delta: func(i int) any {
			d := deltas[i]
			if i == 0 {
				d.Role = "assistant"
			}
			return chunk(d, nil)
		},
		final: func() any {
			finish := m.finishReason()
			d := wireDelta{}
			if len(deltas) == 0 {
				d.Role = "assistant"
			}
			return chunk(d, &finish)
		},
	}
	if includeUsage && !m.NoUsage {
		a.usage = func() any {
			u, _ := json.Marshal(usage)
			raw := json.RawMessage(u)
			return wireChunk{ID: "chatcmpl-fake", Object: "chat.completion.chunk", Created: created, Model: m.Name,
				Choices: []wireChunkChoice{}, Usage: &raw}
		}
	}
	return a
}

// stream writes an answer as server-sent events. Chunk i of the deltas is
// preceded by m's delay (except the first), and the stall and mid-stream
// failure knobs are checked before each chunk and before the final one.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, rec *record, m Model, a sseAnswer) {
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}
	sent := 0
	send := func(v any) bool {
		if sent > 0 && !sleep(r, m.Delay) {
			return false
		}
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		sent++
		return r.Context().Err() == nil
	}
	if !sleep(r, m.PrefillDelay) {
		return
	}
	for i := 0; ; i++ {
		if f := m.Fail; f != nil && f.MidStream && i == f.AfterChunks {
			b, _ := json.Marshal(errorBody(*f))
			fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", b)
			s.markComplete(rec)
			return
		}
		if m.Stall && i == m.StallAfter {
			<-r.Context().Done()
			return
		}
		if i == a.n {
			break
		}
		if !send(a.delta(i)) {
			return
		}
	}
	if !send(a.final()) {
		return
	}
	if a.usage != nil {
		b, _ := json.Marshal(a.usage())
		fmt.Fprintf(w, "data: %s\n\n", b)
	}
	if _, err := fmt.Fprint(w, "data: [DONE]\n\n"); err != nil {
		return
	}
	// The whole answer is written: complete, whether or not the client,
	// having read [DONE], hangs up before the handler returns (it may, as
	// soon as the flush below delivers it).
	s.markComplete(rec)
	if flusher != nil {
		flusher.Flush()
	}
}

func failStatus(f Failure) int {
	if f.Status == 0 {
		return http.StatusInternalServerError
	}
	return f.Status
}

func errorBody(f Failure) any {
	type body struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	b := body{Message: f.Message, Type: f.Type}
	if b.Type == "" {
		b.Type = "server_error"
	}
	if f.Code != "" {
		b.Code = &f.Code
	}
	return struct {
		Error body `json:"error"`
	}{b}
}

func writeError(w http.ResponseWriter, status int, f Failure) {
	writeJSON(w, status, errorBody(f))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
