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
//	input message items          messages; developer is system; text parts
//	                             (input_text, output_text, refusal) joined
//	                             with newlines; input_image as a data URL
//	reasoning items              the reasoning of the assistant message
//	                             that follows (content, else summary)
//	function_call items          tool calls of an assistant message (the
//	                             calls, text and reasoning of one turn join
//	                             one message, as a chat history has them)
//	function_call_output items   tool messages answering call_id
//	tools (type function)        tools; strict is accepted and not enforced
//	tool_choice                  as chat's; {"type":"function","name":N}
//	max_output_tokens, temperature, top_p, text.format, reasoning.effort
//	                             the run's options (effort none: think off;
//	                             any other effort: think on)
//
// The Edge keeps no conversation state (SPEC S6: no durable conversation
// state), so what would need it is refused with a 400 naming the field:
// store true, previous_response_id, conversation, background true, a stored
// prompt, item_reference items and input files. store absent or false is
// accepted, and every response says "store": false. A client keeps the
// conversation in input, as it does with store false at OpenAI.
//
// Built-in tools (web_search, file_search, computer use, ...) run at
// OpenAI, not on a model server: they are refused with a 400.
// parallel_tool_calls, include, truncation, max_tool_calls, top_logprobs
// and stream_options are read and not acted on; metadata is echoed. Every
// other top-level field passes through to the provider (extra_json), as
// chat's do.

// responsesInterpreted are the top-level fields of a Responses request the
// Edge reads or deliberately drops; every other field passes through
// (extraFieldsExcept).
var responsesInterpreted = [...]string{
	"model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "temperature", "top_p",
	"reasoning", "text", "stream", "stream_options", "parallel_tool_calls", "metadata", "store",
	"previous_response_id", "background", "conversation", "prompt", "include", "truncation",
	"max_tool_calls", "top_logprobs",
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
	Store              *bool               `json:"store"`
	PreviousResponseID *string             `json:"previous_response_id"`
	Background         *bool               `json:"background"`
	Conversation       json.RawMessage     `json:"conversation"`
	Prompt             json.RawMessage     `json:"prompt"`
}

type respReasoningParam struct {
	Effort  *string `json:"effort"`
	Summary *string `json:"summary"`
}

type respTextParam struct {
	Format *respTextFormat `json:"format"`
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

// respItem is one item of input; which fields count depends on Type.
type respItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"` // message: a string or parts; reasoning: parts
	Summary   respPartList    `json:"summary"` // reasoning
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"` // function_call_output: a string or parts
}

// respPart is a content part of an input item: input_text, output_text,
// refusal, input_image, reasoning_text, summary_text, input_file.
type respPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Refusal  string `json:"refusal"`
	ImageURL string `json:"image_url"`
	FileID   string `json:"file_id"`
}

// respTool is a tool of a Responses request: flat, unlike chat's.
type respTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"`
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
}

// parseResponses decodes and validates a Responses request's body within
// the bounds chat's has (MaxMessages input items, MaxContentParts parts,
// MaxTools tools): 400 naming the param at fault.
func parseResponses(body []byte) (*parsedResponses, *frontend.Failure) {
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
	run, e := req.toRun()
	if e != nil {
		return nil, e
	}
	if run.Options.ExtraJson, e = extraFieldsExcept(body, responsesInterpreted[:]); e != nil {
		return nil, e
	}
	return &parsedResponses{model: req.Model, stream: req.Stream, run: run, echo: req.echo(run)}, nil
}

// toRun validates req and converts it to a run request.
func (req *responsesRequest) toRun() (*wirepb.RunRequest, *frontend.Failure) {
	if req.Model == "" {
		return nil, invalid("model", "You must provide a model parameter.")
	}
	if e := req.stateless(); e != nil {
		return nil, e
	}
	if len(req.Input) == 0 {
		return nil, invalid("input", "You must provide input: a string or a list of items.")
	}
	run := &wirepb.RunRequest{Options: &wirepb.RunOptions{}}
	var b historyBuilder
	if req.Instructions != nil && *req.Instructions != "" {
		b.add(&wirepb.ChatMessage{Role: "system", Content: *req.Instructions})
	}
	for i := range req.Input {
		if e := b.item(&req.Input[i], fmt.Sprintf("input[%d]", i)); e != nil {
			return nil, e
		}
	}
	run.Messages = b.msgs
	for i, t := range req.Tools {
		param := fmt.Sprintf("tools[%d]", i)
		if t.Type != "function" {
			return nil, invalid(param+".type", "Unsupported tool type %q: the Edge serves only \"function\" tools; "+
				"built-in tools such as web_search or file_search run at OpenAI, not on a model server.", t.Type)
		}
		if t.Name == "" {
			return nil, invalid(param+".name", "A function tool needs a name.")
		}
		wt := &wirepb.Tool{Name: t.Name, Description: t.Description}
		if p := t.Parameters; len(p) > 0 && !bytes.Equal(p, []byte("null")) {
			wt.ParametersJson = p
		}
		run.Tools = append(run.Tools, wt)
	}
	if e := req.options(run.Options); e != nil {
		return nil, e
	}
	var e *frontend.Failure
	if run.Options.ToolChoice, e = respToolChoice(req.ToolChoice, run.Tools); e != nil {
		return nil, e
	}
	return run, nil
}

// stateless refuses what needs conversation state the Edge does not keep.
func (req *responsesRequest) stateless() *frontend.Failure {
	const why = " The Edge keeps no conversation state: send the whole conversation in input (and store false)."
	switch {
	case req.Store != nil && *req.Store:
		return invalid("store", "store true is not supported: responses are not stored."+why)
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
	if r := req.Reasoning; r != nil && r.Effort != nil && *r.Effort != "" {
		think := *r.Effort != "none" // the Node's adapters know only on or off
		o.Think = &think
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
	default:
		return invalid("text.format.type", "Unsupported text.format type %q: expected text, json_object or json_schema.", f.Type)
	}
	return nil
}

// respToolChoice converts a Responses tool_choice to the wire's: the
// strings as chat's, and {"type":"function","name":N} as chat's named form
// (toolChoice checks both against tools). allowed_tools and the built-in
// tools' choices are refused.
func respToolChoice(raw json.RawMessage, tools []*wirepb.Tool) (string, *frontend.Failure) {
	c := bytes.TrimSpace(raw)
	if len(c) == 0 || c[0] != '{' {
		return toolChoice(c, tools)
	}
	var named struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(c, &named); err != nil || named.Type != "function" {
		return toolChoice(c, tools) // refuses it, naming what it is
	}
	chatForm, _ := json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": named.Name}})
	return toolChoice(chatForm, tools)
}

// historyBuilder turns input items into chat messages. The items of one
// assistant turn (reasoning, then text, then function calls, as a response's
// output lists them) join one assistant message; anything else starts a
// new message.
type historyBuilder struct {
	msgs []*wirepb.ChatMessage
}

func (b *historyBuilder) add(m *wirepb.ChatMessage) { b.msgs = append(b.msgs, m) }

// assistant returns the assistant message the next part of a turn joins:
// the last message if it is an assistant message that fits (fits says
// whether it does), else a new one.
func (b *historyBuilder) assistant(fits func(*wirepb.ChatMessage) bool) *wirepb.ChatMessage {
	if n := len(b.msgs); n > 0 && b.msgs[n-1].Role == "assistant" && fits(b.msgs[n-1]) {
		return b.msgs[n-1]
	}
	m := &wirepb.ChatMessage{Role: "assistant"}
	b.add(m)
	return m
}

// item adds one input item; param is its path ("input[3]").
func (b *historyBuilder) item(it *respItem, param string) *frontend.Failure {
	kind := it.Type
	if kind == "" && it.Role != "" {
		kind = "message" // EasyInputMessage: type is optional
	}
	switch kind {
	case "message":
		return b.message(it, param)
	case "reasoning":
		text, e := reasoningText(it, param)
		if e != nil {
			return e
		}
		if text == "" { // an encrypted_content only item: nothing a local model can read
			return nil
		}
		m := b.assistant(func(m *wirepb.ChatMessage) bool { return m.Content == "" && len(m.ToolCalls) == 0 })
		m.Reasoning = joinNonEmpty(m.Reasoning, text)
		return nil
	case "function_call":
		if it.CallID == "" {
			return invalid(param+".call_id", "A function_call item needs a call_id.")
		}
		if it.Name == "" {
			return invalid(param+".name", "A function_call item needs a name.")
		}
		if len(b.msgs) > 0 && len(b.msgs[len(b.msgs)-1].ToolCalls) == MaxToolCalls {
			return invalid(param, "Too many function calls in one turn: at most %d are accepted.", MaxToolCalls)
		}
		m := b.assistant(func(*wirepb.ChatMessage) bool { return true })
		m.ToolCalls = append(m.ToolCalls, &wirepb.ToolCall{Index: int32(len(m.ToolCalls)), Id: it.CallID, Name: it.Name,
			ArgumentsJson: []byte(it.Arguments)})
		return nil
	case "function_call_output":
		if it.CallID == "" {
			return invalid(param+".call_id", "A function_call_output item needs the call_id it answers.")
		}
		m := &wirepb.ChatMessage{Role: "tool", ToolCallId: it.CallID, Name: it.Name}
		if e := partsInto(m, it.Output, param+".output"); e != nil {
			return e
		}
		b.add(m)
		return nil
	case "item_reference":
		return invalid(param+".type", "item_reference items are not supported: the Edge keeps no stored items; send the item itself.")
	case "":
		return invalid(param+".type", "An input item needs a type (or a role, for a message).")
	}
	return invalid(param+".type", "Unsupported input item type %q: expected message, reasoning, function_call or function_call_output.", kind)
}

// message adds a message item.
func (b *historyBuilder) message(it *respItem, param string) *frontend.Failure {
	m := &wirepb.ChatMessage{Role: it.Role}
	switch it.Role {
	case "user", "system":
	case "developer": // OpenAI's newer name for system
		m.Role = "system"
	case "assistant":
	default:
		return invalid(param+".role", "Unsupported role %q: expected user, system, developer or assistant.", it.Role)
	}
	if !given(it.Content) {
		return invalid(param+".content", "A message item needs content.")
	}
	if e := partsInto(m, it.Content, param+".content"); e != nil {
		return e
	}
	if m.Role != "assistant" {
		b.add(m)
		return nil
	}
	if len(m.Images) > 0 {
		return invalid(param+".content", "An assistant message cannot hold images.")
	}
	// The text of a turn whose reasoning came first joins its message.
	a := b.assistant(func(a *wirepb.ChatMessage) bool { return a.Content == "" && len(a.ToolCalls) == 0 })
	a.Content = m.Content
	return nil
}

// partsInto sets m's content (and images) from raw: a string, or a list of
// parts. Text parts are joined with newlines; images must be data URLs,
// since the Node may not reach the client's network.
func partsInto(m *wirepb.ChatMessage, raw json.RawMessage, param string) *frontend.Failure {
	c := bytes.TrimSpace(raw)
	if len(c) > 0 && c[0] == '"' {
		if err := json.Unmarshal(c, &m.Content); err != nil {
			return invalid(param, "%s is not a valid string.", param)
		}
		return nil
	}
	if !given(c) {
		return nil
	}
	var parts respPartList
	if err := json.Unmarshal(c, &parts); err != nil {
		var le *frontdoor.ListTooLong
		if errors.As(err, &le) {
			return invalid(param, "Too many content parts: at most %d are accepted.", le.Max)
		}
		return invalid(param, "%s must be a string or a list of content parts.", param)
	}
	var texts []string
	for j, p := range parts {
		pp := fmt.Sprintf("%s[%d]", param, j)
		switch p.Type {
		case "input_text", "output_text", "text":
			texts = append(texts, p.Text)
		case "refusal":
			texts = append(texts, p.Refusal)
		case "input_image":
			if p.ImageURL == "" {
				return invalid(pp+".image_url", "An input_image needs an image_url (a data URL); file_id is not supported: the Edge keeps no files.")
			}
			img, e := decodeDataURL(p.ImageURL, pp+".image_url")
			if e != nil {
				return e
			}
			m.Images = append(m.Images, img)
		case "input_file":
			return invalid(pp+".type", "input_file parts are not supported: send the file's text as input_text.")
		default:
			return invalid(pp+".type", "Unsupported content part type %q: expected input_text, output_text or input_image.", p.Type)
		}
	}
	m.Content = strings.Join(texts, "\n")
	return nil
}

// reasoningText is the text of a reasoning item: its reasoning_text
// content, or else its summaries.
func reasoningText(it *respItem, param string) (string, *frontend.Failure) {
	var content respPartList
	if given(it.Content) {
		if err := json.Unmarshal(it.Content, &content); err != nil {
			return "", invalid(param+".content", "The content of a reasoning item must be a list of reasoning_text parts.")
		}
	}
	var texts []string
	for _, p := range content {
		texts = append(texts, p.Text)
	}
	if len(texts) == 0 {
		for _, p := range it.Summary {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// joinNonEmpty joins a and b with a newline, or returns whichever is set.
func joinNonEmpty(a, b string) string {
	if a == "" {
		return b
	}
	return a + "\n" + b
}
