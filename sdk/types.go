package sdk

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"
)

// Info describes an adapter.
type Info struct {
	// Name is the adapter's kind, e.g. "ollama". Lowercase, [a-z0-9_-].
	Name string `json:"name"`
	// Version is the adapter's own version.
	Version string `json:"version"`
	// Description is one line for humans.
	Description string `json:"description,omitempty"`
	// ConfigFields documents the keys Configure accepts: key → meaning.
	ConfigFields map[string]string `json:"config_fields,omitempty"`
}

// Capability names, as reported by Capabilities and in `describe`.
const (
	CapListTargets = "list_targets"
	CapTunnel      = "tunnel"
	CapProbe       = "probe"
	CapClose       = "close"
	// CapComplete: raw text completions (Completer).
	CapComplete = "complete"
	// CapEmbed: embeddings (Embedder).
	CapEmbed = "embed"
	// CapTunnelRoute: the Node reaches the server itself for a raw tunnel
	// (TunnelRouter).
	CapTunnelRoute = "tunnel_route"
	// CapCountTokens: the server's own tokenizer counts a prompt
	// (TokenCounter).
	CapCountTokens = "count_tokens"
)

// Capabilities returns the capabilities a implements, derived from the
// optional interfaces it satisfies, in a fixed order.
func Capabilities(a Adapter) []string {
	var caps []string
	if _, ok := a.(TargetLister); ok {
		caps = append(caps, CapListTargets)
	}
	if _, ok := a.(Tunneler); ok {
		caps = append(caps, CapTunnel)
	}
	if _, ok := a.(Prober); ok {
		caps = append(caps, CapProbe)
	}
	if _, ok := a.(Closer); ok {
		caps = append(caps, CapClose)
	}
	if _, ok := a.(Completer); ok {
		caps = append(caps, CapComplete)
	}
	if _, ok := a.(Embedder); ok {
		caps = append(caps, CapEmbed)
	}
	if _, ok := a.(TunnelRouter); ok {
		caps = append(caps, CapTunnelRoute)
	}
	if _, ok := a.(TokenCounter); ok {
		caps = append(caps, CapCountTokens)
	}
	return caps
}

// Config is a provider's adapter configuration, as JSON (the `config` map of
// the Node's provider entry). Decode it strictly with DecodeConfig.
type Config json.RawMessage

// Request is one normalized run.
type Request struct {
	// RunID identifies the run; use it in logs.
	RunID string
	// SessionID is an opaque correlation id. It never links runs: every
	// run is independent, even with the same SessionID (S1).
	SessionID string
	// Target is the model to run.
	Target   string
	Messages []Message
	Tools    []Tool
	Options  Options
	// Prompt and Suffix are a raw completion's text (Completer.Complete
	// only, where Messages and Tools are empty): the model continues
	// Prompt; with a Suffix, it writes what goes between the two
	// (fill-in-the-middle).
	Prompt string
	Suffix string
	// Deadline is the run's hard deadline; ctx carries it too.
	Deadline time.Time
	// StallTimeout is the provider's response-stall timeout for this run
	// (R4). The Node's watchdog enforces it; adapters may use it to size
	// their own upstream timeouts.
	StallTimeout time.Duration
	// Credential is the secret to present upstream for this call only, or
	// nil. Never log it, never store it.
	Credential *Credential
}

// Credential is a secret lent to one call.
type Credential struct {
	// Kind says how to present Secret: "bearer" (Authorization: Bearer).
	Kind   string
	Secret string
}

// Message is one chat message.
type Message struct {
	Role       string // system, user, assistant, tool
	Content    string
	Reasoning  string // the model's thinking, when replayed
	ToolCalls  []ToolCall
	ToolCallID string // for role "tool": the call answered
	Name       string // for role "tool": the tool's name
	Images     [][]byte
}

// Tool is a function the model may call.
type Tool struct {
	Name        string
	Description string
	// Parameters is the JSON Schema of the arguments.
	Parameters json.RawMessage
}

// ToolCall is a call of a tool by the model. In a ToolCallDelta event,
// fields are fragments to append to the call with the same Index.
type ToolCall struct {
	Index     int
	ID        string
	Name      string
	Arguments string // JSON text, or a fragment of it in a delta
}

// Options are the sampling options of a run. Nil means the model's default.
type Options struct {
	Temperature *float64
	TopP        *float64
	MaxTokens   *int64
	Stop        []string
	Seed        *int64
	// Format is "" (text), "json", or a JSON schema, as JSON.
	Format json.RawMessage
	// FormatName and FormatStrict go with a schema in Format: the name the
	// client gave it, and whether it asked for the schema to be enforced
	// strictly (OpenAI's json_schema.name and strict).
	FormatName   string
	FormatStrict bool
	// Think asks a reasoning model to think (true) or not (false).
	Think *bool
	// ReasoningEffort is how hard a reasoning model should think: "" (the
	// model's default), or one of the Effort* levels. An adapter maps it
	// to its server's nearest setting (and documents which it keeps);
	// EffortNone goes with Think false, any other level with Think true.
	ReasoningEffort string
	// Extra holds the client's request fields that the Edge does not
	// interpret, as one JSON object of their names and raw values
	// ({"top_k":20,"chat_template_kwargs":{...}}), in the vocabulary of
	// OpenAI-compatible servers; an "options" object in it holds Ollama's
	// own options (num_ctx...). A field set above wins over the same name
	// here. An adapter maps what its server knows and documents what it
	// drops (SPEC P2).
	Extra json.RawMessage
	// ToolChoice says which tools the model may or must call. An adapter
	// whose server cannot honour it fails the run with KindUnsupported
	// rather than ignore it; Check validates it against the run's tools.
	ToolChoice ToolChoice
}

// Reasoning effort levels (Options.ReasoningEffort), from least to most.
const (
	EffortNone    = "none"
	EffortMinimal = "minimal"
	EffortLow     = "low"
	EffortMedium  = "medium"
	EffortHigh    = "high"
	EffortMax     = "max"
)

// ToolChoice is the wire's RunOptions.tool_choice: "" or ToolChoiceAuto,
// ToolChoiceNone, ToolChoiceRequired, or ToolChoiceFunction(name).
type ToolChoice string

// Tool choices.
const (
	// ToolChoiceAuto (or ""): the model decides whether to call a tool.
	ToolChoiceAuto ToolChoice = "auto"
	// ToolChoiceNone: the model calls no tool.
	ToolChoiceNone ToolChoice = "none"
	// ToolChoiceRequired: the model calls at least one tool.
	ToolChoiceRequired ToolChoice = "required"
)

// toolChoiceFunctionPrefix starts a choice that names one function.
const toolChoiceFunctionPrefix = "function:"

// ToolChoiceFunction returns the choice that makes the model call the
// tool named name.
func ToolChoiceFunction(name string) ToolChoice {
	return ToolChoice(toolChoiceFunctionPrefix + name)
}

// Function returns the name of the tool that c makes the model call, and
// whether c names one.
func (c ToolChoice) Function() (string, bool) {
	return strings.CutPrefix(string(c), toolChoiceFunctionPrefix)
}

// Forces reports whether c makes the model call a tool (required, or a
// named function).
func (c ToolChoice) Forces() bool {
	_, named := c.Function()
	return c == ToolChoiceRequired || named
}

// Check validates c against the run's tools: a known form; required and a
// named function only with tools; a named function only among them. Its
// error is KindInvalidRequest.
func (c ToolChoice) Check(tools []Tool) error {
	name, named := c.Function()
	switch {
	case c == "" || c == ToolChoiceAuto || c == ToolChoiceNone:
		return nil
	case c == ToolChoiceRequired:
		if len(tools) == 0 {
			return Errorf(KindInvalidRequest, "tool choice %q needs tools, and the run has none", c)
		}
		return nil
	case !named || name == "":
		return Errorf(KindInvalidRequest, "unknown tool choice %q: want auto, none, required or function:NAME", c)
	}
	for _, t := range tools {
		if t.Name == name {
			return nil
		}
	}
	return Errorf(KindInvalidRequest, "tool choice names the tool %q, which is not among the run's tools", name)
}

// EventKind is the kind of a run event. There are no terminal kinds: the
// run's outcome is Execute's return value.
type EventKind int

// Event kinds.
const (
	// TextDelta: Text is the next piece of the answer.
	TextDelta EventKind = iota + 1
	// ReasoningDelta: Text is the next piece of the model's thinking.
	ReasoningDelta
	// ToolCallDelta: ToolCall is a call, or the next fragment of one.
	ToolCallDelta
	// UsageReport: Usage is token accounting so far.
	UsageReport
)

func (k EventKind) String() string {
	switch k {
	case TextDelta:
		return "text_delta"
	case ReasoningDelta:
		return "reasoning_delta"
	case ToolCallDelta:
		return "tool_call_delta"
	case UsageReport:
		return "usage"
	}
	return "unknown"
}

// Event is one piece of a run's progress.
type Event struct {
	Kind     EventKind
	Text     string
	ToolCall *ToolCall
	Usage    *Usage
}

// Usage is token accounting and, where the server reports them, timings.
type Usage struct {
	PromptTokens       int64
	CompletionTokens   int64
	TotalDuration      time.Duration
	LoadDuration       time.Duration
	PromptEvalDuration time.Duration
	EvalDuration       time.Duration
}

// Result is a completed run's outcome.
type Result struct {
	// DoneReason is why generation stopped: "stop", "length",
	// "tool_calls", or the server's own word.
	DoneReason string
	// Usage is the final accounting, if the server reported it.
	Usage *Usage
}

// TunnelRequest is one raw HTTP request to relay to the model server.
type TunnelRequest struct {
	TunnelID  string
	SessionID string
	Target    string
	Method    string
	// Path is the path and query, relative to the server's base URL.
	Path       string
	Header     http.Header
	Body       io.Reader // the request body, streamed; never nil
	Credential *Credential
}

// TunnelResponse receives the model server's answer, in order: WriteHeader
// once, then the body as the server flushed it.
type TunnelResponse interface {
	WriteHeader(status int, header http.Header) error
	// Write sends the next body bytes; each call is flushed to the host.
	Write(p []byte) (int, error)
}

// HealthStatus is the answer of an exact-target probe.
type HealthStatus int

// Probe answers. Anything that is not a clear yes or no is Unknown.
const (
	HealthUnknown HealthStatus = iota
	HealthAvailable
	HealthUnavailable
)

func (h HealthStatus) String() string {
	switch h {
	case HealthAvailable:
		return "available"
	case HealthUnavailable:
		return "unavailable"
	}
	return "unknown"
}

// Health is a probe's result.
type Health struct {
	Status HealthStatus
	// Detail says why, for logs: no payload text, no credentials.
	Detail string
}

// Target is a model a server offers.
type Target struct {
	Name string
}
