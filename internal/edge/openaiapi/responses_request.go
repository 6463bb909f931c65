package openaiapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// A Responses API request (POST /v1/responses) becomes the same normalized
// run as a chat request (SPEC R2, P2):
//
//	instructions                 a system message, first
//	input "text"                 one user message
//	input items                  the conversation (responses_items.go)
//	tools                        functions, namespaces, custom tools and the
//	                             client-run built-ins as functions; hosted
//	                             tools dropped or refused (tools.go,
//	                             responses_tools.go); strict is accepted and
//	                             not enforced
//	tool_choice                  as chat's; {"type":"function","name":N}
//	                             (a namespace's member by its inner name, or
//	                             with "namespace"), {"type":"custom","name":N},
//	                             {"type":"shell"}, {"type":"apply_patch"}
//	max_output_tokens, temperature, top_p, text.format
//	                             the run's options; json_schema's schema,
//	                             name and strict are the run's format
//	reasoning.effort             the run's reasoning effort (effort.go)
//	text.verbosity               "verbosity" in extra_json, chat's name for it
//	prompt_cache_key             the session key (session.go), and passed on
//
// The Edge keeps no conversation state (SPEC S6: no durable conversation
// state), so what would need it is refused with a 400 naming the field:
// previous_response_id, conversation, background true, a stored prompt,
// item_reference items and input files. store is accepted, true or false,
// and every response says "store": false, which is what happened: nothing
// is stored, so a later read of the response by its id finds nothing. A
// client keeps the conversation in input, as it does with store false at
// OpenAI.
//
// parallel_tool_calls, include (no encrypted reasoning is ever returned),
// reasoning.summary, reasoning.generate_summary, truncation,
// max_tool_calls, top_logprobs, stream_options and client_metadata (Codex's
// telemetry for OpenAI) are read and not acted on; context_management
// (OpenAI's compaction) is dropped: the client's context is what it sends;
// metadata is echoed. Every other top-level field passes through to the
// provider (extra_json), as chat's do: user, safety_identifier,
// service_tier, prompt_cache_key, prompt_cache_retention...

// responsesInterpreted are the top-level fields of a Responses request the
// Edge reads or deliberately drops; every other field passes through
// (extraFieldsExcept).
var responsesInterpreted = [...]string{
	"model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "temperature", "top_p",
	"reasoning", "text", "stream", "stream_options", "parallel_tool_calls", "metadata", "store",
	"previous_response_id", "background", "conversation", "prompt", "include", "truncation",
	"max_tool_calls", "top_logprobs", "client_metadata", "context_management",
}

// MaxMetadataPairs bounds a request's metadata, as OpenAI does; it is
// echoed in the response, so it is held for the request's life.
const MaxMetadataPairs = 16

// responsesRequest is the part of a Responses request the Edge reads.
type responsesRequest struct {
	Model              string              `json:"model"`
	Input              respItemList        `json:"input"`
	Instructions       *string             `json:"instructions"`
	Tools              respToolList        `json:"tools"`
	ToolChoice         json.RawMessage     `json:"tool_choice"`
	MaxOutputTokens    *int64              `json:"max_output_tokens"`
	Temperature        *float64            `json:"temperature"`
	TopP               *float64            `json:"top_p"`
	Reasoning          *respReasoningParam `json:"reasoning"`
	Text               *respTextParam      `json:"text"`
	Stream             bool                `json:"stream"`
	ParallelToolCalls  *bool               `json:"parallel_tool_calls"`
	Metadata           map[string]string   `json:"metadata"`
	PreviousResponseID *string             `json:"previous_response_id"`
	Background         *bool               `json:"background"`
	Conversation       json.RawMessage     `json:"conversation"`
	Prompt             json.RawMessage     `json:"prompt"`
	// Read for the session key, and passed on.
	PromptCacheKey   string `json:"prompt_cache_key"`
	User             string `json:"user"`
	SafetyIdentifier string `json:"safety_identifier"`
}

type respReasoningParam struct {
	Effort  *string `json:"effort"`
	Summary *string `json:"summary"`
}

type respTextParam struct {
	Format    *respTextFormat `json:"format"`
	Verbosity *string         `json:"verbosity"`
}

// respTextFormat is text.format: {"type":"text"}, {"type":"json_object"} or
// {"type":"json_schema","name":...,"schema":{...},"strict":...}.
type respTextFormat struct {
	Type        string          `json:"type"`
	Name        string          `json:"name,omitempty"`
	Description string          `json:"description,omitempty"`
	Schema      json.RawMessage `json:"schema,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// Bounded lists, as chat's (frontdoor.DecodeList).
type (
	respItemList []respItem
	respPartList []respPart
	respToolList []respTool
)

// UnmarshalJSON reads input: a string is one user message.
func (l *respItemList) UnmarshalJSON(b []byte) (err error) {
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '"' {
		var s string
		if err := json.Unmarshal(t, &s); err != nil {
			return err
		}
		text, _ := json.Marshal(s) // a string always marshals
		*l = respItemList{{Type: "message", Role: "user", Content: text}}
		return nil
	}
	*l, err = frontdoor.DecodeList[respItem](b, MaxMessages, "input")
	return err
}

func (l *respPartList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[respPart](b, MaxContentParts, "content")
	return err
}

func (l *respToolList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[respTool](b, MaxTools, "tools")
	return err
}

// parsedResponses is a Responses request ready to run, with what the
// response echoes of it.
type parsedResponses struct {
	model  string
	stream bool
	run    *wirepb.RunRequest
	echo   responseEcho
	// tools map the model's calls back to the tools the client declared.
	tools *toolset
	// hosted are the hosted tool types the request declared, which it
	// runs without (or is refused for).
	hosted []string
	// session is the conversation's key, without the headers' (sessionKey).
	promptCacheKey, user, safetyIdentifier string
}

// parseResponses decodes and validates a Responses request's body within
// the bounds chat's has (MaxMessages input items, MaxContentParts parts,
// MaxTools tools, a namespace's included): 400 naming the param at fault.
func parseResponses(body []byte) (*parsedResponses, *frontend.Failure) {
	return parseResponsesFor(body, false)
}

// parseResponsesFor is parseResponses; count says the request is one to
// count the tokens of (POST /v1/responses/input_tokens), whose input may
// be absent.
func parseResponsesFor(body []byte, count bool) (*parsedResponses, *frontend.Failure) {
	var req responsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		// encoding/json prefixes the field of an error that a list's
		// decoder named already ("input.input[3].role"): drop the repeat.
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			if head, rest, ok := strings.Cut(te.Field, "."); ok && strings.HasPrefix(rest, head) {
				te.Field = rest
			}
		}
		return nil, jsonError(err)
	}
	p := &parsedResponses{model: req.Model, stream: req.Stream && !count,
		promptCacheKey: req.PromptCacheKey, user: req.User, safetyIdentifier: req.SafetyIdentifier}
	var e *frontend.Failure
	if p.run, p.tools, p.hosted, e = req.toRun(count); e != nil {
		return nil, e
	}
	var mapped map[string][]byte
	if t := req.Text; t != nil && t.Verbosity != nil && *t.Verbosity != "" {
		v, _ := json.Marshal(*t.Verbosity) // a string always marshals
		mapped = map[string][]byte{"verbosity": v}
	}
	if p.run.Options.ExtraJson, e = extraFieldsWith(body, responsesInterpreted[:], mapped); e != nil {
		return nil, e
	}
	p.echo = req.echo()
	return p, nil
}

// toRun validates req and converts it to a run request, with its tools
// and the hosted tool types it declared.
func (req *responsesRequest) toRun(count bool) (*wirepb.RunRequest, *toolset, []string, *frontend.Failure) {
	if req.Model == "" {
		return nil, nil, nil, invalid("model", "You must provide a model parameter.")
	}
	if e := req.stateless(); e != nil {
		return nil, nil, nil, e
	}
	if len(req.Input) == 0 && !count {
		return nil, nil, nil, invalid("input", "You must provide input: a string or a list of items.")
	}
	tools, hosted, e := respTools(req.Tools)
	if e != nil {
		return nil, nil, nil, e
	}
	run := &wirepb.RunRequest{Options: &wirepb.RunOptions{}, Tools: tools.tools()}
	b := historyBuilder{tools: tools}
	if req.Instructions != nil && *req.Instructions != "" {
		b.add(&wirepb.ChatMessage{Role: "system", Content: *req.Instructions})
	}
	for i := range req.Input {
		if e := b.item(&req.Input[i], fmt.Sprintf("input[%d]", i)); e != nil {
			return nil, nil, nil, e
		}
	}
	run.Messages = b.msgs
	if e := req.options(run.Options); e != nil {
		return nil, nil, nil, e
	}
	if run.Options.ToolChoice, e = respToolChoice(req.ToolChoice, tools); e != nil {
		return nil, nil, nil, e
	}
	return run, tools, hosted, nil
}

// stateless refuses what needs conversation state the Edge does not keep.
func (req *responsesRequest) stateless() *frontend.Failure {
	const why = " The Edge keeps no conversation state: send the whole conversation in input."
	switch {
	case req.PreviousResponseID != nil && *req.PreviousResponseID != "":
		return invalid("previous_response_id", "previous_response_id is not supported: no response is stored."+why)
	case given(req.Conversation):
		return invalid("conversation", "conversation is not supported."+why)
	case req.Background != nil && *req.Background:
		return invalid("background", "background true is not supported: a response is answered on its request."+why)
	case given(req.Prompt):
		return invalid("prompt", "Stored prompts are not supported: send the prompt in instructions and input.")
	case len(req.Metadata) > MaxMetadataPairs:
		return invalid("metadata", "metadata may hold at most %d pairs, got %d.", MaxMetadataPairs, len(req.Metadata))
	}
	return nil
}

// given reports whether a raw field was sent with a value other than null.
func given(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// options fills o from the sampling, length, format and reasoning fields.
func (req *responsesRequest) options(o *wirepb.RunOptions) *frontend.Failure {
	if t := req.Temperature; t != nil {
		if *t < 0 || *t > 2 {
			return invalid("temperature", "temperature must be between 0 and 2, got %v.", *t)
		}
		o.Temperature = t
	}
	if p := req.TopP; p != nil {
		if *p < 0 || *p > 1 {
			return invalid("top_p", "top_p must be between 0 and 1, got %v.", *p)
		}
		o.TopP = p
	}
	if m := req.MaxOutputTokens; m != nil {
		if *m < 1 {
			return invalid("max_output_tokens", "max_output_tokens must be at least 1, got %d.", *m)
		}
		o.MaxTokens = m
	}
	if r := req.Reasoning; r != nil && r.Effort != nil {
		if e := reasoningEffort(o, "reasoning.effort", *r.Effort); e != nil {
			return e
		}
	}
	if req.Text == nil || req.Text.Format == nil {
		return nil
	}
	switch f := req.Text.Format; f.Type {
	case "", "text":
	case "json_object":
		o.Format = []byte("json")
	case "json_schema":
		if !given(f.Schema) || !json.Valid(f.Schema) {
			return invalid("text.format.schema", "A json_schema text format needs a schema.")
		}
		o.Format = f.Schema
		o.FormatName, o.FormatStrict = f.Name, f.Strict != nil && *f.Strict
	default:
		return invalid("text.format.type", "Unsupported text.format type %q: expected text, json_object or json_schema.", f.Type)
	}
	return nil
}

// respToolChoice converts a Responses tool_choice to the wire's: the
// strings as chat's; {"type":"function","name":N} (and "namespace", if
// given), {"type":"custom","name":N} and a client-run built-in's
// {"type":"shell"} as the function the model sees for it (toolChoice
// checks them against the run's tools). allowed_tools and the hosted
// tools' choices are refused.
func respToolChoice(raw json.RawMessage, tools *toolset) (string, *frontend.Failure) {
	c := bytes.TrimSpace(raw)
	if len(c) == 0 || c[0] != '{' {
		return toolChoice(c, tools.tools())
	}
	var named struct {
		Type      string `json:"type"`
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	}
	if err := json.Unmarshal(c, &named); err != nil {
		return toolChoice(c, tools.tools()) // refuses it, naming what it is
	}
	name := named.Name
	switch b := builtinTools[named.Type]; {
	case named.Type == "function":
		if flat := tools.chosen(toolFunction, named.Namespace, name); flat != "" {
			name = flat
		}
	case named.Type == "custom":
		if flat := tools.chosen(toolCustom, named.Namespace, name); flat != "" {
			name = flat
		} else if name != "" {
			return "", invalid("tool_choice", "tool_choice names the custom tool %q, which is not among tools.", name)
		}
	case b != nil:
		name = tools.chosen(toolBuiltin, "", b.typ)
		if name == "" {
			return "", invalid("tool_choice", "tool_choice names the %s tool, which is not among tools.", b.typ)
		}
	default:
		return toolChoice(c, tools.tools()) // refuses it, naming what it is
	}
	chatForm, _ := json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": name}})
	return toolChoice(chatForm, tools.tools())
}
