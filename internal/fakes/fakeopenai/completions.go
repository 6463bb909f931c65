package fakeopenai

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/iop-dev/iop/internal/fakes/fakemodel"
)

// completionRequest is the part of a text completion request the fake
// reads.
type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Suffix        *string         `json:"suffix"`
	MaxTokens     *int            `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// Wire shapes of a text completion.
type (
	wireTextChoice struct {
		Text         string    `json:"text"`
		Index        int       `json:"index"`
		Logprobs     *struct{} `json:"logprobs"`
		FinishReason *string   `json:"finish_reason"`
	}
	wireTextCompletion struct {
		ID      string           `json:"id"`
		Object  string           `json:"object"`
		Created int64            `json:"created"`
		Model   string           `json:"model"`
		Choices []wireTextChoice `json:"choices"`
		// Usage is null on every chunk but the last when usage was asked
		// for, absent otherwise; always there when not streaming.
		Usage *json.RawMessage `json:"usage,omitempty"`
	}
)

// completions answers a text completion: m's tokens as the text (cut to
// max_tokens, finishing with "length"), streamed as text_completion chunks
// or whole, with the same knobs as chat (delay, prefill, failure, stall).
func (s *Server) completions(w http.ResponseWriter, r *http.Request, rec *record, cfg Config) {
	var req completionRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, Failure{Message: "We could not parse the JSON body of your request.", Type: "invalid_request_error"})
		return
	}
	prompt, ok := onePrompt(req.Prompt)
	if !ok {
		writeError(w, http.StatusBadRequest, Failure{Message: "prompt must be a string or an array of one string.", Type: "invalid_request_error"})
		return
	}
	m, ok := cfg.model(req.Model)
	if !ok {
		writeError(w, http.StatusNotFound, Failure{
			Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", req.Model),
			Type:    "invalid_request_error", Code: "model_not_found",
		})
		return
	}
	if req.Suffix != nil && *req.Suffix != "" && m.NoSuffix {
		writeError(w, http.StatusBadRequest, Failure{Message: "suffix is not currently supported", Type: "invalid_request_error"})
		return
	}
	if !sleep(r, m.HeaderDelay) {
		return
	}
	if m.Fail != nil && (!m.Fail.MidStream || !req.Stream) {
		writeError(w, failStatus(*m.Fail), *m.Fail)
		return
	}
	promptTokens := fakemodel.Tokens(nil).AppendText(prompt)
	m, cached := s.prefill(rec, m, promptTokens)
	tokens, finish := m.tokens(), "stop"
	if req.MaxTokens != nil && *req.MaxTokens < len(tokens) {
		tokens, finish = tokens[:*req.MaxTokens], "length"
	}
	u, _ := json.Marshal(wireUsage{PromptTokens: len(promptTokens), CompletionTokens: len(tokens),
		TotalTokens: len(promptTokens) + len(tokens), PromptTokensDetails: &wirePromptDetails{CachedTokens: cached}})
	usage := json.RawMessage(u)
	object := func(choices []wireTextChoice, usage *json.RawMessage) wireTextCompletion {
		return wireTextCompletion{ID: "cmpl-fake", Object: "text_completion", Created: created, Model: m.Name, Choices: choices, Usage: usage}
	}
	if !req.Stream {
		if m.Stall {
			<-r.Context().Done()
			return
		}
		if !sleep(r, m.PrefillDelay) {
			return
		}
		writeJSON(w, http.StatusOK, object([]wireTextChoice{{Text: strings.Join(tokens, ""), FinishReason: &finish}}, &usage))
		return
	}
	var null *json.RawMessage
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		n := json.RawMessage("null")
		null = &n
	}
	a := sseAnswer{
		n:     len(tokens),
		delta: func(i int) any { return object([]wireTextChoice{{Text: tokens[i]}}, null) },
		final: func() any { return object([]wireTextChoice{{FinishReason: &finish}}, null) },
	}
	if null != nil && !m.NoUsage {
		a.usage = func() any { return object([]wireTextChoice{}, &usage) }
	}
	s.stream(w, r, rec, m, a)
}

// onePrompt reads a prompt that is a string or an array of one string.
func onePrompt(raw json.RawMessage) (string, bool) {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one, true
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil && len(list) == 1 {
		return list[0], true
	}
	return "", false
}

// embeddingsRequest is an embeddings request as the fake reads it.
type embeddingsRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	Dimensions     *int            `json:"dimensions"`
	EncodingFormat string          `json:"encoding_format"`
}

// embeddings answers a vector per input, in OpenAI's list shape: a
// deterministic unit vector of the model's EmbeddingDims from a hash of
// the model and the input (Vector), shortened and normalized again for
// dimensions, as floats or base64 (little-endian float32).
func (s *Server) embeddings(w http.ResponseWriter, r *http.Request, cfg Config) {
	var req embeddingsRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, Failure{Message: "We could not parse the JSON body of your request.", Type: "invalid_request_error"})
		return
	}
	inputs, ok := embeddingInputs(req.Input)
	if !ok {
		writeError(w, http.StatusBadRequest, Failure{
			Message: "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference.",
			Type:    "invalid_request_error",
		})
		return
	}
	m, ok := cfg.model(req.Model)
	if !ok {
		writeError(w, http.StatusNotFound, Failure{
			Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", req.Model),
			Type:    "invalid_request_error", Code: "model_not_found",
		})
		return
	}
	if !sleep(r, m.HeaderDelay) {
		return
	}
	if m.Fail != nil {
		writeError(w, failStatus(*m.Fail), *m.Fail)
		return
	}
	dims := m.embeddingDims()
	if d := req.Dimensions; d != nil {
		if *d < 1 || *d > dims {
			writeError(w, http.StatusBadRequest, Failure{
				Message: fmt.Sprintf("Invalid value for 'dimensions' = %d. Must be between 1 and %d.", *d, dims),
				Type:    "invalid_request_error", Code: "invalid_value",
			})
			return
		}
		dims = *d
	}
	type item struct {
		Object    string `json:"object"`
		Index     int    `json:"index"`
		Embedding any    `json:"embedding"`
	}
	out := struct {
		Object string    `json:"object"`
		Data   []item    `json:"data"`
		Model  string    `json:"model"`
		Usage  wireUsage `json:"usage"`
	}{Object: "list", Data: []item{}, Model: m.Name}
	for i, in := range inputs {
		v := Vector(m.Name, in, m.embeddingDims())
		if dims < len(v) {
			v = normalized(v[:dims])
		}
		var e any = v
		if req.EncodingFormat == "base64" {
			b := make([]byte, 0, 4*len(v))
			for _, f := range v {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
			}
			e = base64.StdEncoding.EncodeToString(b)
		}
		out.Data = append(out.Data, item{Object: "embedding", Index: i, Embedding: e})
		out.Usage.PromptTokens += max(len(strings.Fields(in)), 1)
	}
	out.Usage.TotalTokens = out.Usage.PromptTokens
	writeJSON(w, http.StatusOK, out)
}

// embeddingInputs reads input: a string, an array of strings, or token
// arrays (one array of ints, or arrays of them), each array becoming the
// text of its numbers. Nothing may be empty.
func embeddingInputs(raw json.RawMessage) ([]string, bool) {
	var one string
	var texts []string
	var tokens []int
	var tokenLists [][]int
	switch {
	case json.Unmarshal(raw, &one) == nil:
		texts = []string{one}
	case json.Unmarshal(raw, &texts) == nil:
	case json.Unmarshal(raw, &tokens) == nil:
		texts = []string{fmt.Sprint(tokens)}
	case json.Unmarshal(raw, &tokenLists) == nil:
		for _, l := range tokenLists {
			texts = append(texts, fmt.Sprint(l))
		}
	default:
		return nil, false
	}
	for _, t := range texts {
		if t == "" || t == "[]" {
			return nil, false
		}
	}
	return texts, len(texts) > 0
}

func (m Model) embeddingDims() int {
	if m.EmbeddingDims > 0 {
		return m.EmbeddingDims
	}
	return 8
}

// Vector is the fake's embedding of text by model: a unit vector of dims
// values from a hash of both.
func Vector(model, text string, dims int) []float32 {
	v := make([]float32, dims)
	for i := range v {
		sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%s\x00%d", model, text, i))
		v[i] = float32(int64(binary.LittleEndian.Uint64(sum[:8])>>11)%2001-1000) / 1000
	}
	return normalized(v)
}

// normalized scales v to length 1, in place, and returns it.
func normalized(v []float32) []float32 {
	var sum float64
	for _, x := range v {
		sum += float64(x) * float64(x)
	}
	if sum > 0 {
		n := math.Sqrt(sum)
		for i := range v {
			v[i] = float32(float64(v[i]) / n)
		}
	}
	return v
}
