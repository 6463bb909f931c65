package anthropicapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Bounds on what one request's JSON may make the Edge build (P3), counted
// as the body is decoded (frontdoor.DecodeList), not after.
const (
	// MaxMessages bounds a request's messages.
	MaxMessages = 10_000
	// MaxBlocks bounds the content blocks of one message, of the system
	// prompt, and of one tool_result.
	MaxBlocks = 1_000
	// MaxTools bounds a request's tools.
	MaxTools = 1_000
	// MaxStopSequences bounds stop_sequences.
	MaxStopSequences = 1_000
)

// messagesRequest is the part of an Anthropic Messages (or count_tokens)
// request the Edge reads. Every other field (service_tier,
// context_management, container, cache_control, speed, inference_geo,
// ...) is Anthropic's own vocabulary, which no provider behind the Edge
// speaks: it is ignored on purpose, not passed through (see the package
// comment). Metadata and mcp_servers are read as they are, never
// rejected: metadata only names the session, mcp_servers only says the
// request has tools the Edge drops.
type messagesRequest struct {
	Model         string          `json:"model"`
	System        json.RawMessage `json:"system"` // a string or text blocks
	Messages      messageList     `json:"messages"`
	Tools         toolList        `json:"tools"`
	ToolChoice    *toolChoice     `json:"tool_choice"`
	MaxTokens     *int64          `json:"max_tokens"`
	StopSequences stopList        `json:"stop_sequences"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	TopK          *int64          `json:"top_k"`
	Thinking      *thinking       `json:"thinking"`
	OutputConfig  *struct {
		Effort string `json:"effort"`
		Format *struct {
			Type   string          `json:"type"`
			Schema json.RawMessage `json:"schema"`
		} `json:"format"`
	} `json:"output_config"`
	Metadata   json.RawMessage `json:"metadata"`
	MCPServers json.RawMessage `json:"mcp_servers"`
	Stream     bool            `json:"stream"`
}

type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"` // a string or blocks
	// ClearAt, on a system turn: "next_user_message" shows it to the model
	// only until a user turn follows it; "never" (the default) always.
	ClearAt string `json:"clear_at"`
}

// block is any content block; Type says which fields it uses.
type block struct {
	Type string `json:"type"`
	// text
	Text string `json:"text"`
	// image and document: a source object (content.go); search_result:
	// the name of its source
	Source json.RawMessage `json:"source"`
	// document and search_result
	Title   string `json:"title"`
	Context string `json:"context"`
	// tool_reference
	ToolName string `json:"tool_name"`
	// tool_addition and tool_removal: the tool referenced or defined
	Tool json.RawMessage `json:"tool"`
	// tool_use
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
	// tool_result
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"` // a string or blocks; search_result: text blocks
	IsError   bool            `json:"is_error"`
	// thinking
	Thinking string `json:"thinking"`
}

type tool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
	// computer_*: the screen's size, which its description tells the model
	DisplayWidthPx  *int64 `json:"display_width_px"`
	DisplayHeightPx *int64 `json:"display_height_px"`
}

type toolChoice struct {
	Type string `json:"type"`
	Name string `json:"name"`
}

type thinking struct {
	Type         string `json:"type"`
	BudgetTokens *int64 `json:"budget_tokens"`
}

// Bounded lists: each decodes with frontdoor.DecodeList.
type (
	messageList []message
	blockList   []block
	toolList    []tool
	stopList    []string
)

func (l *messageList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[message](b, MaxMessages, "messages")
	return err
}

func (l *blockList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[block](b, MaxBlocks, "content")
	return err
}

func (l *toolList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[tool](b, MaxTools, "tools")
	return err
}

func (l *stopList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[string](b, MaxStopSequences, "stop_sequences")
	return err
}

// parsedMessages is a request ready to run (or to count).
type parsedMessages struct {
	model  string
	stream bool
	run    *wirepb.RunRequest
	// hosted are the types of the hosted tools the run goes without (see
	// tools.go), declared in hostedParam; the translation drops or refuses
	// them per profile.
	hosted      []string
	hostedParam string
	// dropped are the kinds of content the run goes without
	// ("document:pdf"...), each replaced by a placeholder the model reads
	// (content.go).
	dropped []string
	// userID is metadata.user_id, "" for none: a session key when no
	// header names the session.
	userID string
}

// peekMessages reads the model of a request's body, and whether it
// streams, before the principal's right to the model is checked and the
// rest is decoded: decoding it allocates nothing but the model's name,
// however large the body. A body that is not a JSON object, or names no
// model, is 400.
func peekMessages(body []byte) (frontend.Peek, *frontend.Failure) {
	var p struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return frontend.Peek{}, jsonError(err)
	}
	if p.Model == "" {
		return frontend.Peek{}, invalid("model", "Field required")
	}
	return frontend.Peek{Model: p.Model, Stream: p.Stream}, nil
}

// parseMessages decodes and validates a Messages request's body, within
// the bounds above: 400 naming the offending field.
func parseMessages(body []byte) (*parsedMessages, *frontend.Failure) {
	return parse(body, false)
}

// parseCount decodes and validates a count_tokens request's body: a
// Messages request without max_tokens (and whose stream means nothing).
func parseCount(body []byte) (*parsedMessages, *frontend.Failure) {
	return parse(body, true)
}

// parse is parseMessages, or parseCount when count.
func parse(body []byte, count bool) (*parsedMessages, *frontend.Failure) {
	var req messagesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, jsonError(err)
	}
	switch {
	case count:
		req.Stream = false
	case req.MaxTokens == nil:
		return nil, invalid("max_tokens", "Field required")
	}
	p := &parsedMessages{model: req.Model, stream: req.Stream, userID: metadataUserID(req.Metadata)}
	var e *frontend.Failure
	if p.run, p.hosted, p.dropped, e = req.toRun(); e != nil {
		return nil, e
	}
	p.hostedParam = "tools"
	var servers []json.RawMessage
	if json.Unmarshal(req.MCPServers, &servers) == nil && len(servers) > 0 && !slices.Contains(p.hosted, "mcp_toolset") {
		// MCP servers that Anthropic's API would connect to and offer the
		// tools of (the MCP connector; in its later form an mcp_toolset
		// tool names each, and is dropped as a tool): hosted tools too. A
		// value that is not a list is ignored, as metadata is.
		if len(p.hosted) == 0 {
			p.hostedParam = "mcp_servers"
		}
		p.hosted = append(p.hosted, "mcp_servers")
	}
	return p, nil
}

// jsonError maps a decoding error to a 400 naming what it can.
func jsonError(err error) *frontend.Failure {
	var te *json.UnmarshalTypeError
	var le *frontdoor.ListTooLong
	switch {
	case errors.As(err, &le):
		return invalid(le.Param, "too many elements: at most %d are accepted", le.Max)
	case errors.As(err, &te):
		return invalid(fieldPath(te.Field), "expected %s, got %s", te.Type, te.Value)
	}
	return invalid("", "the request body is not valid JSON: %v", err)
}

// fieldPath writes a decoding error's field ("messages.messages[0].role":
// the struct field, then the bounded list's own name and index) as
// Anthropic writes paths ("messages.0.role").
func fieldPath(f string) string {
	parts := strings.Split(strings.NewReplacer("[", ".", "]", "").Replace(f), ".")
	if len(parts) > 1 && parts[0] == parts[1] {
		parts = parts[1:]
	}
	return strings.Join(parts, ".")
}

// toRun validates req and converts it to a run request, and says which
// hosted tools (their types) it goes without and which kinds of content it
// left out (content.go).
func (req *messagesRequest) toRun() (*wirepb.RunRequest, []string, []string, *frontend.Failure) {
	if req.MaxTokens != nil && *req.MaxTokens < 1 {
		return nil, nil, nil, invalid("max_tokens", "must be at least 1, got %d", *req.MaxTokens)
	}
	if len(req.Messages) == 0 {
		return nil, nil, nil, invalid("messages", "at least one message is required")
	}
	run := &wirepb.RunRequest{Options: &wirepb.RunOptions{MaxTokens: req.MaxTokens}}
	system, e := systemText(req.System, "system")
	if e != nil {
		return nil, nil, nil, e
	}
	if system != "" {
		run.Messages = append(run.Messages, &wirepb.ChatMessage{Role: "system", Content: system})
	}
	c := newConversion()
	lastUser := -1
	for i := range req.Messages {
		if req.Messages[i].Role == "user" {
			lastUser = i
		}
	}
	for i := range req.Messages {
		ms, e := req.Messages[i].toWire(fmt.Sprintf("messages.%d", i), c)
		if e != nil {
			return nil, nil, nil, e
		}
		if m := &req.Messages[i]; m.Role == "system" && m.ClearAt == "next_user_message" && i < lastUser {
			// Its turn has passed: the client keeps it, the model no
			// longer reads it. Its tool changes hold: they changed the
			// tools, not what the model reads.
			continue
		}
		run.Messages = append(run.Messages, ms...)
	}
	var hosted []string
	var hostedNames map[string]string
	if run.Tools, hosted, hostedNames, e = toolsOf(req.Tools); e != nil {
		return nil, nil, nil, e
	}
	if run.Tools, hosted, hostedNames, e = applyToolChanges(run.Tools, hosted, hostedNames, c.changes); e != nil {
		return nil, nil, nil, e
	}
	if run.Options.ToolChoice, e = req.ToolChoice.toWire(run.Tools, hostedNames); e != nil {
		return nil, nil, nil, e
	}
	if e := req.options(run.Options); e != nil {
		return nil, nil, nil, e
	}
	return run, hosted, c.dropped, nil
}

// systemText is the top-level system prompt: a string, or text blocks
// joined by blank lines.
func systemText(raw json.RawMessage, field string) (string, *frontend.Failure) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", invalid(field, "not a valid string")
		}
		return s, nil
	}
	blocks, e := decodeBlocks(raw, field)
	if e != nil {
		return "", e
	}
	texts := make([]string, 0, len(blocks))
	for j, b := range blocks {
		if b.Type != "text" {
			return "", invalid(fmt.Sprintf("%s.%d.type", field, j), "unsupported block type %q here: expected text", b.Type)
		}
		texts = append(texts, b.Text)
	}
	return strings.Join(texts, "\n\n"), nil
}

// decodeBlocks decodes an array of content blocks.
func decodeBlocks(raw json.RawMessage, field string) (blockList, *frontend.Failure) {
	var blocks blockList
	if err := json.Unmarshal(raw, &blocks); err != nil {
		var le *frontdoor.ListTooLong
		if errors.As(err, &le) {
			return nil, invalid(field, "too many content blocks: at most %d are accepted", le.Max)
		}
		return nil, invalid(field, "expected a string or an array of content blocks")
	}
	return blocks, nil
}

// toWire converts one message to the wire's messages: an assistant
// message to one (text, thinking as its reasoning, tool_use blocks as its
// tool calls); a user message to one "tool" message per tool_result block,
// in order, then one user message with the rest of its text and images
// (and the images of the tool results, which chat APIs only take from a
// user; documents, search results and what the model cannot have as
// content.go says). c gathers what the conversion learns on the way.
func (m *message) toWire(field string, c *conversion) ([]*wirepb.ChatMessage, *frontend.Failure) {
	content := bytes.TrimSpace(m.Content)
	if len(content) == 0 || bytes.Equal(content, []byte("null")) {
		return nil, invalid(field+".content", "Field required")
	}
	switch m.Role {
	case "user", "assistant":
	case "system":
		// A system turn inside the conversation (Claude Code's environment
		// block): instructions that hold from where they stand, so a system
		// message there; an empty one says nothing and is left out. Its
		// tool changes are gathered in c (content.go).
		text, e := c.systemTurn(content, field+".content")
		if e != nil || text == "" {
			return nil, e
		}
		return []*wirepb.ChatMessage{{Role: "system", Content: text}}, nil
	default:
		return nil, invalid(field+".role", "unsupported role %q: expected user, assistant or system", m.Role)
	}
	if content[0] == '"' {
		wm := &wirepb.ChatMessage{Role: m.Role}
		if err := json.Unmarshal(content, &wm.Content); err != nil {
			return nil, invalid(field+".content", "not a valid string")
		}
		return []*wirepb.ChatMessage{wm}, nil
	}
	blocks, e := decodeBlocks(content, field+".content")
	if e != nil {
		return nil, e
	}
	if m.Role == "assistant" {
		wm, e := assistantMessage(blocks, field+".content", c.toolNames)
		if e != nil {
			return nil, e
		}
		return []*wirepb.ChatMessage{wm}, nil
	}
	return userMessages(blocks, field+".content", c)
}

func assistantMessage(blocks blockList, field string, toolNames map[string]string) (*wirepb.ChatMessage, *frontend.Failure) {
	wm := &wirepb.ChatMessage{Role: "assistant"}
	var texts, thoughts []string
	for j, b := range blocks {
		f := fmt.Sprintf("%s.%d", field, j)
		switch b.Type {
		case "text":
			texts = append(texts, b.Text)
		case "thinking":
			thoughts = append(thoughts, b.Thinking)
		case "redacted_thinking": // encrypted for Anthropic's models: nothing a provider here can read
		case "tool_use":
			if b.ID == "" || b.Name == "" {
				return nil, invalid(f, "a tool_use block needs an id and a name")
			}
			args := bytes.TrimSpace(b.Input)
			if len(args) == 0 || bytes.Equal(args, []byte("null")) {
				args = []byte("{}")
			}
			toolNames[b.ID] = b.Name
			wm.ToolCalls = append(wm.ToolCalls, &wirepb.ToolCall{Index: int32(len(wm.ToolCalls)), Id: b.ID, Name: b.Name, ArgumentsJson: args})
		default:
			return nil, invalid(f+".type", "unsupported block type %q in an assistant message: expected text, thinking or tool_use", b.Type)
		}
	}
	wm.Content, wm.Reasoning = strings.Join(texts, "\n\n"), strings.Join(thoughts, "\n\n")
	return wm, nil
}

func userMessages(blocks blockList, field string, c *conversion) ([]*wirepb.ChatMessage, *frontend.Failure) {
	var out []*wirepb.ChatMessage
	user := &wirepb.ChatMessage{Role: "user"}
	var texts []string
	for j := range blocks {
		b, f := &blocks[j], fmt.Sprintf("%s.%d", field, j)
		if b.Type != "tool_result" {
			text, imgs, handled, e := c.userContent(b, f)
			if e != nil {
				return nil, e
			}
			if !handled {
				return nil, invalid(f+".type", "unsupported block type %q in a user message: expected text, image, document, search_result or tool_result", b.Type)
			}
			if text != "" || b.Type == "text" {
				texts = append(texts, text)
			}
			user.Images = append(user.Images, imgs...)
			continue
		}
		if b.ToolUseID == "" {
			return nil, invalid(f+".tool_use_id", "Field required")
		}
		tm := &wirepb.ChatMessage{Role: "tool", ToolCallId: b.ToolUseID, Name: c.toolNames[b.ToolUseID]}
		if rc := bytes.TrimSpace(b.Content); len(rc) > 0 && !bytes.Equal(rc, []byte("null")) {
			text, imgs, e := c.resultContent(rc, f+".content")
			if e != nil {
				return nil, e
			}
			tm.Content = text
			user.Images = append(user.Images, imgs...)
		}
		if b.IsError {
			// Chat APIs have no error flag on a tool's result: say it in
			// the words the model reads.
			tm.Content = "Error: " + tm.Content
		}
		out = append(out, tm)
	}
	user.Content = strings.Join(texts, "\n\n")
	if user.Content != "" || len(user.Images) > 0 || len(out) == 0 {
		out = append(out, user)
	}
	return out, nil
}

// toWire converts Anthropic's tool_choice to the wire's (see RunOptions
// in wire.proto): auto and none as they are, any as "required", and
// {"type":"tool","name":"f"} as "function:f", which must name one of the
// run's tools (not one of the hosted tools, named in hosted, that it goes
// without). disable_parallel_tool_use has no portable equivalent and is
// ignored.
func (c *toolChoice) toWire(tools []*wirepb.Tool, hosted map[string]string) (string, *frontend.Failure) {
	if c == nil {
		return "", nil
	}
	switch c.Type {
	case "auto", "none":
		return c.Type, nil
	case "any":
		if len(tools) == 0 {
			return "", invalid("tool_choice", `"any" needs tools, and the request has none`)
		}
		return "required", nil
	case "tool":
		if c.Name == "" {
			return "", invalid("tool_choice.name", "Field required")
		}
		for _, t := range tools {
			if t.Name == c.Name {
				return "function:" + c.Name, nil
			}
		}
		if typ, ok := hosted[c.Name]; ok {
			return "", hostedChoice(c.Name, typ)
		}
		return "", invalid("tool_choice.name", "the tool %q is not among the request's tools", c.Name)
	}
	return "", invalid("tool_choice.type", `unsupported tool_choice %q: expected auto, any, tool or none`, c.Type)
}

// options fills o from the sampling fields, thinking and effort
// (thinking.go) and the output format of req. top_k has no field of its own on the wire: it travels in
// extra_json, under the name both the OpenAI-compatible servers and the
// ollama adapter know.
func (req *messagesRequest) options(o *wirepb.RunOptions) *frontend.Failure {
	for _, f := range []struct {
		name string
		v    *float64
	}{{"temperature", req.Temperature}, {"top_p", req.TopP}} {
		if f.v != nil && (*f.v < 0 || *f.v > 1) {
			return invalid(f.name, "must be between 0 and 1, got %v", *f.v)
		}
	}
	o.Temperature, o.TopP = req.Temperature, req.TopP
	if k := req.TopK; k != nil {
		if *k < 0 {
			return invalid("top_k", "must be at least 0, got %d", *k)
		}
		o.ExtraJson, _ = json.Marshal(map[string]int64{"top_k": *k})
	}
	o.Stop = req.StopSequences
	if e := req.reasoning(o); e != nil {
		return e
	}
	if oc := req.OutputConfig; oc != nil && oc.Format != nil {
		if oc.Format.Type != "json_schema" {
			return invalid("output_config.format.type", "unsupported format %q: expected json_schema", oc.Format.Type)
		}
		if s := bytes.TrimSpace(oc.Format.Schema); len(s) == 0 || s[0] != '{' {
			return invalid("output_config.format.schema", "a JSON schema object is required")
		}
		o.Format = bytes.TrimSpace(oc.Format.Schema)
	}
	return nil
}
