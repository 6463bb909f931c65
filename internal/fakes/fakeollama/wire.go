package fakeollama

import (
	"encoding/json"
	"time"
)

// The types below are Ollama's wire shapes, written out independently of
// github.com/ollama/ollama/api so that the fake's tests, which decode its
// output with the official client, prove the shapes rather than restate
// them. Field order follows the real server's structs, so the bytes on the
// wire read the same as Ollama's.

// ChatRequest is the body of POST /api/chat.
type ChatRequest struct {
	Model     string          `json:"model"`
	Messages  []Message       `json:"messages"`
	Stream    *bool           `json:"stream,omitempty"`
	Format    json.RawMessage `json:"format,omitempty"`
	KeepAlive json.RawMessage `json:"keep_alive,omitempty"`
	Tools     []Tool          `json:"tools,omitempty"`
	Options   map[string]any  `json:"options,omitempty"`
	Think     json.RawMessage `json:"think,omitempty"`
}

// GenerateRequest is the body of POST /api/generate.
type GenerateRequest struct {
	Model     string          `json:"model"`
	Prompt    string          `json:"prompt"`
	Suffix    string          `json:"suffix,omitempty"`
	System    string          `json:"system,omitempty"`
	Raw       bool            `json:"raw,omitempty"`
	Stream    *bool           `json:"stream,omitempty"`
	Format    json.RawMessage `json:"format,omitempty"`
	KeepAlive json.RawMessage `json:"keep_alive,omitempty"`
	Images    [][]byte        `json:"images,omitempty"`
	Options   map[string]any  `json:"options,omitempty"`
	Think     json.RawMessage `json:"think,omitempty"`
}

// EmbedRequest is the body of POST /api/embed. Input is a string or a list
// of strings.
type EmbedRequest struct {
	Model      string          `json:"model"`
	Input      json.RawMessage `json:"input"`
	KeepAlive  json.RawMessage `json:"keep_alive,omitempty"`
	Truncate   *bool           `json:"truncate,omitempty"`
	Dimensions int             `json:"dimensions,omitempty"`
	Options    map[string]any  `json:"options,omitempty"`
}

// EmbeddingRequest is the body of the legacy POST /api/embeddings.
type EmbeddingRequest struct {
	Model     string          `json:"model"`
	Prompt    string          `json:"prompt"`
	KeepAlive json.RawMessage `json:"keep_alive,omitempty"`
	Options   map[string]any  `json:"options,omitempty"`
}

// EmbeddingResponse is the answer of the legacy /api/embeddings.
type EmbeddingResponse struct {
	Embedding []float64 `json:"embedding"`
}

// ShowRequest is the body of POST /api/show. Name is the deprecated
// spelling of Model.
type ShowRequest struct {
	Model string `json:"model"`
	Name  string `json:"name,omitempty"`
}

// Message is one chat message, in a request or (partially) in a streamed
// response line. Images travel as base64 strings, which []byte gives.
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	Thinking   string     `json:"thinking,omitempty"`
	Images     [][]byte   `json:"images,omitempty"`
	ToolCalls  []WireCall `json:"tool_calls,omitempty"`
	ToolName   string     `json:"tool_name,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// WireCall is a tool call as Ollama writes it: arguments are a JSON object,
// not a string.
type WireCall struct {
	ID       string       `json:"id,omitempty"`
	Function WireFunction `json:"function"`
}

// WireFunction is the function part of a WireCall.
type WireFunction struct {
	Index     int             `json:"index"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// Tool is a tool offered in a chat request.
type Tool struct {
	Type     string       `json:"type"`
	Function ToolFunction `json:"function"`
}

// ToolFunction is the function of a Tool.
type ToolFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// Metrics are the counts and durations of a final line. Durations are
// nanoseconds on the wire.
type Metrics struct {
	TotalDuration      time.Duration `json:"total_duration,omitempty"`
	LoadDuration       time.Duration `json:"load_duration,omitempty"`
	PromptEvalCount    int           `json:"prompt_eval_count,omitempty"`
	PromptEvalDuration time.Duration `json:"prompt_eval_duration,omitempty"`
	EvalCount          int           `json:"eval_count,omitempty"`
	EvalDuration       time.Duration `json:"eval_duration,omitempty"`
}

// ChatResponse is one NDJSON line of /api/chat (or its single answer when
// stream is false).
type ChatResponse struct {
	Model      string    `json:"model"`
	CreatedAt  time.Time `json:"created_at"`
	Message    Message   `json:"message"`
	Done       bool      `json:"done"`
	DoneReason string    `json:"done_reason,omitempty"`
	Metrics
}

// GenerateResponse is one NDJSON line of /api/generate.
type GenerateResponse struct {
	Model      string    `json:"model"`
	CreatedAt  time.Time `json:"created_at"`
	Response   string    `json:"response"`
	Thinking   string    `json:"thinking,omitempty"`
	Done       bool      `json:"done"`
	DoneReason string    `json:"done_reason,omitempty"`
	Context    []int     `json:"context,omitempty"`
	Metrics
}

// EmbedResponse is the answer of /api/embed.
type EmbedResponse struct {
	Model           string        `json:"model"`
	Embeddings      [][]float32   `json:"embeddings"`
	TotalDuration   time.Duration `json:"total_duration,omitempty"`
	LoadDuration    time.Duration `json:"load_duration,omitempty"`
	PromptEvalCount int           `json:"prompt_eval_count,omitempty"`
}

// ModelDetails is the details object of /api/tags, /api/show and /api/ps.
type ModelDetails struct {
	ParentModel       string   `json:"parent_model"`
	Format            string   `json:"format"`
	Family            string   `json:"family"`
	Families          []string `json:"families"`
	ParameterSize     string   `json:"parameter_size"`
	QuantizationLevel string   `json:"quantization_level"`
}

// ListModel is one entry of /api/tags.
type ListModel struct {
	Name       string       `json:"name"`
	Model      string       `json:"model"`
	ModifiedAt time.Time    `json:"modified_at"`
	Size       int64        `json:"size"`
	Digest     string       `json:"digest"`
	Details    ModelDetails `json:"details"`
}

// ListResponse is the answer of /api/tags.
type ListResponse struct {
	Models []ListModel `json:"models"`
}

// ProcessModel is one entry of /api/ps.
type ProcessModel struct {
	Name          string       `json:"name"`
	Model         string       `json:"model"`
	Size          int64        `json:"size"`
	Digest        string       `json:"digest"`
	Details       ModelDetails `json:"details"`
	ExpiresAt     time.Time    `json:"expires_at"`
	SizeVRAM      int64        `json:"size_vram"`
	ContextLength int          `json:"context_length"`
}

// ProcessResponse is the answer of /api/ps.
type ProcessResponse struct {
	Models []ProcessModel `json:"models"`
}

// ShowResponse is the answer of /api/show.
type ShowResponse struct {
	Modelfile    string         `json:"modelfile,omitempty"`
	Parameters   string         `json:"parameters,omitempty"`
	Template     string         `json:"template,omitempty"`
	Details      ModelDetails   `json:"details"`
	ModelInfo    map[string]any `json:"model_info"`
	Capabilities []string       `json:"capabilities,omitempty"`
	ModifiedAt   time.Time      `json:"modified_at"`
}

// errorBody is every error answer: {"error": "..."}.
type errorBody struct {
	Error string `json:"error"`
}
