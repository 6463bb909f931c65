package fakeollama

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakemodel"
)

// Model is one model the fake serves, with the knobs that shape its answers.
// The zero value of every knob means "behave like a healthy, fast model".
// Durations travel as nanoseconds when a Model is sent to the control API.
type Model struct {
	// Name is the name /api/tags lists, e.g. "llama3.2:latest". A request
	// for "llama3.2" matches "llama3.2:latest", as in Ollama.
	Name string `json:"name"`

	// Text, when set, is the answer, streamed one word per line (each word
	// after the first keeps its leading space). When empty, the answer is
	// TokenCount words drawn deterministically from Seed.
	Text       string `json:"text,omitempty"`
	Seed       uint64 `json:"seed,omitempty"`
	TokenCount int    `json:"token_count,omitempty"` // default 8
	// Thinking, when set, is streamed as message.thinking before the answer
	// when the request does not say think:false. A request with think:true
	// (or a level) for a model without Thinking is refused with 400, as
	// Ollama does.
	Thinking string `json:"thinking,omitempty"`
	// ThinkLevels is a model whose template takes think levels, as gpt-oss
	// in Ollama: "low" streams the first third of Thinking, "medium" (and a
	// bool, which such a model ignores: it always thinks) two thirds,
	// "high" and "max" all of it. A model without it takes a level as true.
	ThinkLevels bool `json:"think_levels,omitempty"`
	// RefuseThinkLevels answers a level for a model without ThinkLevels
	// with 400 `think value "high" is not supported for this model`, as
	// Ollama 0.17.4 to 0.17.6 did (for a model not rendered with the
	// harmony parser); later releases take it as true.
	RefuseThinkLevels bool `json:"refuse_think_levels,omitempty"`
	// ToolCalls are emitted, in one line after the answer's words, when the
	// request offers tools (and Agent is not set).
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// Agent, when set, answers as a coding agent's model does: one call to
	// a tool the request offers for a turn that asks, a quote of the tool's
	// result for a turn that carries one, the model's own answer without
	// tools (see fakemodel.Agent). A format constrains the answer to JSON
	// instead, as Ollama's grammar does: no tool calls then.
	Agent *Agent `json:"agent,omitempty"`
	// OmitToolCallIDs leaves out the "id" of tool calls, as Ollama before
	// 0.12 did.
	OmitToolCallIDs bool `json:"omit_tool_call_ids,omitempty"`

	// PrefillDelay passes before the first line (and before the response
	// head, as with a real prefill). TokenDelay passes before every later
	// line. LoadDelay is how long a load request (empty prompt or no
	// messages) takes to answer.
	PrefillDelay time.Duration `json:"prefill_delay,omitempty"`
	TokenDelay   time.Duration `json:"token_delay,omitempty"`
	LoadDelay    time.Duration `json:"load_delay,omitempty"`
	// PrefillPerToken is added to PrefillDelay for every prompt token the
	// server's prompt cache does not hold: a chat or generate costs it for
	// the prompt's tokens past its longest common prefix with a prompt the
	// server served recently (see Server.SetPromptCache), as a real
	// server's prefill skips what its KV cache holds.
	PrefillPerToken time.Duration `json:"prefill_per_token,omitempty"`

	// Stall, when true, stops the stream after StallAfter lines (0: before
	// the response head) and keeps the connection open, sending nothing,
	// until the client goes away.
	Stall      bool `json:"stall,omitempty"`
	StallAfter int  `json:"stall_after,omitempty"`
	// ErrorMessage, when set, ends the stream after ErrorAfter lines with
	// an {"error": ErrorMessage} line, as Ollama does for a failure after
	// output has started.
	ErrorMessage string `json:"error_message,omitempty"`
	ErrorAfter   int    `json:"error_after,omitempty"`
	// EndWithoutDone ends the stream cleanly after the answer but without
	// the final done line: the "stream that just stops" case.
	EndWithoutDone bool `json:"end_without_done,omitempty"`
	// FailStatus, when set, answers chat, generate (including load
	// requests) and embed with this status and {"error": FailMessage}.
	FailStatus  int    `json:"fail_status,omitempty"`
	FailMessage string `json:"fail_message,omitempty"`

	// PromptEvalCount, when set, is reported as prompt_eval_count instead of
	// the fake's own count of the prompt's words.
	PromptEvalCount int `json:"prompt_eval_count,omitempty"`
	// EmbeddingDims is the length of embeddings (default 8). A request's
	// dimensions below it shortens them, normalized again, as Ollama does.
	EmbeddingDims int `json:"embedding_dims,omitempty"`
	// NoInsert is a model without fill-in-the-middle: a generate with a
	// suffix is refused with 400 "does not support insert", as Ollama
	// refuses it for a model whose template has no suffix.
	NoInsert bool `json:"no_insert,omitempty"`

	// Family, ParameterSize and Quantization fill the details object.
	Family        string `json:"family,omitempty"`
	ParameterSize string `json:"parameter_size,omitempty"`
	Quantization  string `json:"quantization,omitempty"`
	Size          int64  `json:"size,omitempty"`
}

// ToolCall is a call the model makes. Arguments is a JSON object.
type ToolCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// words is the vocabulary of seeded answers.
var words = []string{
	"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
	"india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa",
	"quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey",
	"xray", "yankee", "zulu", "river", "stone", "cloud", "ember", "harbor",
	"meadow",
}

// Answer returns the tokens the model streams as its answer, in order:
// their concatenation is the answer's text.
func (m Model) Answer() []string {
	if m.Text != "" {
		return splitTokens(m.Text)
	}
	n := m.TokenCount
	if n <= 0 {
		n = 8
	}
	rng := rand.New(rand.NewPCG(m.Seed, m.Seed^0x9e3779b97f4a7c15))
	out := make([]string, n)
	for i := range out {
		w := words[rng.IntN(len(words))]
		if i > 0 {
			w = " " + w
		}
		out[i] = w
	}
	return out
}

// AnswerText is the whole answer: the concatenation of Answer.
func (m Model) AnswerText() string { return strings.Join(m.Answer(), "") }

// ThinkingTokens returns the tokens of the model's thinking.
func (m Model) ThinkingTokens() []string { return splitTokens(m.Thinking) }

// splitTokens cuts s into words, each word after the first keeping the
// whitespace before it, so that joining the tokens gives s back.
func splitTokens(s string) []string { return fakemodel.Pieces(s) }

// baseName returns name with ":latest" added when it has no tag.
func baseName(name string) string {
	if name == "" || strings.Contains(name, ":") {
		return name
	}
	return name + ":latest"
}

func (m Model) details() ModelDetails {
	family := m.Family
	if family == "" {
		family = "llama"
	}
	size := m.ParameterSize
	if size == "" {
		size = "1B"
	}
	quant := m.Quantization
	if quant == "" {
		quant = "Q4_K_M"
	}
	return ModelDetails{
		Format:            "gguf",
		Family:            family,
		Families:          []string{family},
		ParameterSize:     size,
		QuantizationLevel: quant,
	}
}

func (m Model) size() int64 {
	if m.Size > 0 {
		return m.Size
	}
	return 1 << 30
}

func (m Model) digest() string {
	sum := sha256.Sum256([]byte(m.Name))
	return hex.EncodeToString(sum[:])
}

func (m Model) capabilities() []string {
	caps := []string{"completion", "tools"}
	if !m.NoInsert {
		caps = append(caps, "insert")
	}
	if m.Thinking != "" {
		caps = append(caps, "thinking")
	}
	return caps
}

// embedding returns a deterministic unit vector for text, of dims values
// when dims is above 0 and below the model's length (its first values,
// normalized again).
func (m Model) embedding(text string, dims int) []float32 {
	vec := m.fullEmbedding(text)
	if dims > 0 && dims < len(vec) {
		vec = normalized(vec[:dims])
	}
	return vec
}

// fullEmbedding is the model's own embedding of text.
func (m Model) fullEmbedding(text string) []float32 {
	dims := m.EmbeddingDims
	if dims <= 0 {
		dims = 8
	}
	sum := sha256.Sum256([]byte(text))
	seed := uint64(0)
	for _, b := range sum[:8] {
		seed = seed<<8 | uint64(b)
	}
	rng := rand.New(rand.NewPCG(seed, m.Seed))
	vec := make([]float32, dims)
	for i := range vec {
		vec[i] = float32(rng.Float64()*2 - 1)
	}
	return normalized(vec)
}

// normalized scales vec to length 1, in place, and returns it.
func normalized(vec []float32) []float32 {
	var norm float64
	for _, v := range vec {
		norm += float64(v) * float64(v)
	}
	norm = math.Sqrt(norm)
	for i := range vec {
		vec[i] = float32(float64(vec[i]) / norm)
	}
	return vec
}

// countWords is the fake's token count of a prompt: its words, at least 1.
func countWords(texts ...string) int {
	n := 0
	for _, t := range texts {
		n += len(strings.Fields(t))
	}
	return max(n, 1)
}
