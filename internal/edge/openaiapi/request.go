package openaiapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Bounds on what one request's JSON may make the Edge build. JSON is
// compact and Go values are not (an empty message "{}" is 3 bytes of
// JSON and some 200 bytes decoded), so the counts are bounded as the body
// is decoded, not after: a body of a million empty messages is refused at
// the first one past the bound.
const (
	// MaxMessages bounds a request's messages.
	MaxMessages = 10_000
	// MaxContentParts bounds one message's content parts.
	MaxContentParts = 1_000
	// MaxTools bounds a request's tools.
	MaxTools = 1_000
	// MaxToolCalls bounds one assistant message's tool calls.
	MaxToolCalls = 1_000
	// MaxExtraFields bounds the top-level fields of a request that the
	// Edge passes through uninterpreted (extraFields). Their size has no
	// bound of its own: they travel in the run, which must fit the Edge's
	// request limit (the front end's 413), so that a large chat_template_kwargs or a
	// vendor's documents field passes when the run fits.
	MaxExtraFields = 256
)

// chatRequest is the part of an OpenAI chat request the Edge reads. The
// fields it does not know travel with the run uninterpreted (extraFields).
type chatRequest struct {
	Model               string          `json:"model"`
	Messages            messageList     `json:"messages"`
	Tools               toolList        `json:"tools"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	Stop                json.RawMessage `json:"stop"`
	Seed                *int64          `json:"seed"`
	N                   *int64          `json:"n"`
	ResponseFormat      *responseFormat `json:"response_format"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	ReasoningEffort     *string         `json:"reasoning_effort"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	// WebSearchOptions asks for OpenAI's hosted web search: dropped (or
	// refused), as a hosted tool is.
	WebSearchOptions json.RawMessage `json:"web_search_options"`
	// Read for the session key, and passed on.
	PromptCacheKey   string `json:"prompt_cache_key"`
	User             string `json:"user"`
	SafetyIdentifier string `json:"safety_identifier"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type message struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"` // a string, an array of parts, or null
	Name             string          `json:"name"`
	ToolCalls        toolCallList    `json:"tool_calls"`
	ToolCallID       string          `json:"tool_call_id"`
	ReasoningContent string          `json:"reasoning_content"`
}

type contentPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Refusal  string `json:"refusal"`
	ImageURL *struct {
		URL string `json:"url"`
	} `json:"image_url"`
}

// toolCall is a tool call of an assistant message: a function's, or a
// custom tool's.
type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
	Custom *struct {
		Name  string `json:"name"`
		Input string `json:"input"`
	} `json:"custom"`
}

// tool is a tool of a chat request: a function, or a custom tool (offered
// as a function of one string, tools.go).
type tool struct {
	Type     string `json:"type"`
	Function *struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
	Custom *struct {
		Name        string        `json:"name"`
		Description string        `json:"description"`
		Format      *customFormat `json:"format"`
	} `json:"custom"`
}

type responseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Strict *bool           `json:"strict"`
	} `json:"json_schema"`
}

// parsedChat is a request ready to run.
type parsedChat struct {
	model        string
	stream       bool
	includeUsage bool
	run          *wirepb.RunRequest
	// tools map the model's calls back to the tools the client declared.
	tools *toolset
	// hosted are the hosted tools the request asked for (web search),
	// which it runs without (or is refused for).
	hosted []string
	// session is the conversation's key, without the headers' (sessionKey).
	promptCacheKey, user, safetyIdentifier string
}

// peekChat reads the model of a request's body (every endpoint of this
// API names it in "model"), and whether it streams, before the principal's
// right to the model is checked and the rest is decoded: decoding it
// allocates nothing but the model's name, however large the body. A body
// that is not a JSON object, or names no model, is 400.
func peekChat(body []byte) (frontend.Peek, *frontend.Failure) {
	var p struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return frontend.Peek{}, jsonError(err)
	}
	if p.Model == "" {
		return frontend.Peek{}, invalid("model", "You must provide a model parameter.")
	}
	return frontend.Peek{Model: p.Model, Stream: p.Stream}, nil
}

// parseChat decodes and validates a chat request's body, within the
// bounds above: 400 naming the param at fault. (The front end refuses a
// run too large for the Node with 413.)
func parseChat(body []byte) (*parsedChat, *frontend.Failure) {
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, jsonError(err)
	}
	run, tools, e := req.toRun()
	if e != nil {
		return nil, e
	}
	if run.Options.ExtraJson, e = extraFields(body); e != nil {
		return nil, e
	}
	p := &parsedChat{
		model:          req.Model,
		stream:         req.Stream,
		includeUsage:   req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		run:            run,
		tools:          tools,
		promptCacheKey: req.PromptCacheKey, user: req.User, safetyIdentifier: req.SafetyIdentifier,
	}
	if given(req.WebSearchOptions) {
		p.hosted = []string{"web_search"}
	}
	return p, nil
}

// jsonError maps a decoding error to a 400 naming what it can.
func jsonError(err error) *frontend.Failure {
	var te *json.UnmarshalTypeError
	var le *frontdoor.ListTooLong
	switch {
	case errors.As(err, &le):
		return invalid(le.Param, "Too many %s: at most %d are accepted.", le.Param, le.Max)
	case errors.As(err, &te):
		field := frontdoor.FieldPath(te)
		return invalid(field, "Invalid type for '%s': expected %s, got %s.", field, te.Type, te.Value)
	}
	return invalid("", "We could not parse the JSON body of your request: %v", err)
}

// Bounded lists: each decodes with frontdoor.DecodeList.
type (
	messageList  []message
	toolList     []tool
	toolCallList []toolCall
	partList     []contentPart
)

func (l *messageList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[message](b, MaxMessages, "messages")
	return err
}

func (l *toolList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[tool](b, MaxTools, "tools")
	return err
}

func (l *toolCallList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[toolCall](b, MaxToolCalls, "tool_calls")
	return err
}

func (l *partList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[contentPart](b, MaxContentParts, "content")
	return err
}

// toRun validates req and converts it to a run request, with its tools.
func (req *chatRequest) toRun() (*wirepb.RunRequest, *toolset, *frontend.Failure) {
	if req.Model == "" {
		return nil, nil, invalid("model", "You must provide a model parameter.")
	}
	if len(req.Messages) == 0 {
		return nil, nil, invalid("messages", "[] is too short - 'messages'")
	}
	if req.N != nil && *req.N != 1 {
		return nil, nil, invalid("n", "Only n=1 is supported.")
	}
	tools, e := req.toolset()
	if e != nil {
		return nil, nil, e
	}
	run := &wirepb.RunRequest{Options: &wirepb.RunOptions{}, Tools: tools.tools()}
	for i := range req.Messages {
		m, e := req.Messages[i].toWire(fmt.Sprintf("messages[%d]", i), tools)
		if e != nil {
			return nil, nil, e
		}
		run.Messages = append(run.Messages, m)
	}
	if e := req.options(run.Options); e != nil {
		return nil, nil, e
	}
	if run.Options.ToolChoice, e = chatToolChoice(req.ToolChoice, tools); e != nil {
		return nil, nil, e
	}
	return run, tools, nil
}

// toolset is the request's tools as the model sees them: functions as
// they are, custom tools as functions of one string (tools.go).
func (req *chatRequest) toolset() (*toolset, *frontend.Failure) {
	if len(req.Tools) == 0 {
		return nil, nil
	}
	decls := make([]toolDecl, 0, len(req.Tools))
	for i, t := range req.Tools {
		param := fmt.Sprintf("tools[%d]", i)
		var d toolDecl
		switch t.Type {
		case "function":
			if t.Function == nil || t.Function.Name == "" {
				return nil, invalid(param+".function.name", "A function tool needs a name.")
			}
			d = toolDecl{declaredTool: declaredTool{kind: toolFunction, name: t.Function.Name}, description: t.Function.Description}
			if given(t.Function.Parameters) {
				d.parameters = t.Function.Parameters
			}
		case "custom":
			if t.Custom == nil || t.Custom.Name == "" {
				return nil, invalid(param+".custom.name", "A custom tool needs a name.")
			}
			d = toolDecl{declaredTool: declaredTool{kind: toolCustom, name: t.Custom.Name},
				description: customDescription(t.Custom.Description, t.Custom.Format), parameters: customParameters}
		default:
			return nil, invalid(param+".type", "Unsupported tool type %q: expected \"function\" or \"custom\".", t.Type)
		}
		d.exact = true
		decls = append(decls, d)
	}
	return newToolset(decls), nil
}

// chatToolChoice is toolChoice, with a custom tool's choice
// ({"type":"custom","custom":{"name":N}}) as the choice of the function the
// model sees for it.
func chatToolChoice(raw json.RawMessage, tools *toolset) (string, *frontend.Failure) {
	var custom struct {
		Type   string `json:"type"`
		Custom *struct {
			Name string `json:"name"`
		} `json:"custom"`
	}
	if c := bytes.TrimSpace(raw); len(c) == 0 || c[0] != '{' || json.Unmarshal(c, &custom) != nil || custom.Type != "custom" {
		return toolChoice(raw, tools.tools())
	}
	if custom.Custom == nil || custom.Custom.Name == "" {
		return "", invalid("tool_choice", "A custom tool_choice needs the custom tool's name.")
	}
	flat := tools.chosen(toolCustom, "", custom.Custom.Name)
	if flat == "" {
		return "", invalid("tool_choice", "tool_choice names the custom tool %q, which is not among tools.", custom.Custom.Name)
	}
	return "function:" + flat, nil
}

// toolChoice converts OpenAI's tool_choice to the wire's (see RunOptions
// in wire.proto): "auto", "none" and "required" as they are, and
// {"type":"function","function":{"name":"f"}} as "function:f". It refuses
// "required" or a named function without tools, a name that is not among
// them, and any other form (allowed_tools, custom tools), naming
// tool_choice.
func toolChoice(raw json.RawMessage, tools []*wirepb.Tool) (string, *frontend.Failure) {
	c := bytes.TrimSpace(raw)
	if len(c) == 0 || bytes.Equal(c, []byte("null")) {
		return "", nil
	}
	if c[0] == '"' {
		var word string
		if err := json.Unmarshal(c, &word); err != nil {
			return "", invalid("tool_choice", "tool_choice is not a valid string.")
		}
		switch word {
		case "auto", "none":
			return word, nil
		case "required":
			if len(tools) == 0 {
				return "", invalid("tool_choice", `tool_choice "required" needs tools, and the request has none.`)
			}
			return word, nil
		}
		return "", invalid("tool_choice", `Unsupported tool_choice %q: expected "auto", "none", "required" or a named function.`, word)
	}
	var named struct {
		Type     string `json:"type"`
		Function *struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(c, &named); err != nil {
		return "", invalid("tool_choice", `tool_choice must be "auto", "none", "required" or {"type":"function","function":{"name":...}}.`)
	}
	if named.Type != "function" {
		return "", invalid("tool_choice", `Unsupported tool_choice type %q: only "function" is supported.`, named.Type)
	}
	if named.Function == nil || named.Function.Name == "" {
		return "", invalid("tool_choice", "A function tool_choice needs the function's name.")
	}
	name := named.Function.Name
	for _, t := range tools {
		if t.Name == name {
			return "function:" + name, nil
		}
	}
	if len(tools) == 0 {
		return "", invalid("tool_choice", "tool_choice names the function %q, and the request has no tools.", name)
	}
	return "", invalid("tool_choice", "tool_choice names the function %q, which is not among tools.", name)
}

// options fills o from the sampling and format fields of req.
func (req *chatRequest) options(o *wirepb.RunOptions) *frontend.Failure {
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
	for _, f := range []struct {
		name string
		v    *int64
	}{{"max_tokens", req.MaxTokens}, {"max_completion_tokens", req.MaxCompletionTokens}} {
		if f.v == nil {
			continue
		}
		if *f.v < 1 {
			return invalid(f.name, "%s must be at least 1, got %d.", f.name, *f.v)
		}
		o.MaxTokens = f.v // max_completion_tokens, the newer name, wins
	}
	o.Seed = req.Seed
	if re := req.ReasoningEffort; re != nil {
		if e := reasoningEffort(o, "reasoning_effort", *re); e != nil {
			return e
		}
	}
	if s := req.Stop; len(s) > 0 && !bytes.Equal(s, []byte("null")) {
		var one string
		if err := json.Unmarshal(s, &one); err == nil {
			o.Stop = []string{one}
		} else if err := json.Unmarshal(s, &o.Stop); err != nil {
			return invalid("stop", "stop must be a string or an array of strings.")
		}
	}
	if rf := req.ResponseFormat; rf != nil {
		switch rf.Type {
		case "", "text":
		case "json_object":
			o.Format = []byte("json")
		case "json_schema":
			if rf.JSONSchema == nil || len(rf.JSONSchema.Schema) == 0 || !json.Valid(rf.JSONSchema.Schema) {
				return invalid("response_format.json_schema.schema", "A json_schema response format needs a schema.")
			}
			o.Format = rf.JSONSchema.Schema
			o.FormatName, o.FormatStrict = rf.JSONSchema.Name, rf.JSONSchema.Strict != nil && *rf.JSONSchema.Strict
		default:
			return invalid("response_format.type", "Unsupported response_format type %q.", rf.Type)
		}
	}
	return nil
}

// toWire validates one message; param is its path ("messages[2]"). Its
// tool calls name the functions the model sees (tools).
func (m *message) toWire(param string, tools *toolset) (*wirepb.ChatMessage, *frontend.Failure) {
	wm := &wirepb.ChatMessage{Role: m.Role, Name: m.Name, ToolCallId: m.ToolCallID, Reasoning: m.ReasoningContent}
	switch m.Role {
	case "system", "user", "assistant":
	case "developer": // OpenAI's newer name for system
		wm.Role = "system"
	case "tool":
		if m.ToolCallID == "" {
			return nil, invalid(param+".tool_call_id", "A tool message needs the tool_call_id it answers.")
		}
	default:
		return nil, invalid(param+".role", "Unsupported role %q: expected system, developer, user, assistant or tool.", m.Role)
	}
	if e := m.content(wm, param+".content"); e != nil {
		return nil, e
	}
	if len(m.ToolCalls) > 0 && m.Role != "assistant" {
		return nil, invalid(param+".tool_calls", "Only assistant messages may carry tool_calls.")
	}
	for i, tc := range m.ToolCalls {
		p := fmt.Sprintf("%s.tool_calls[%d]", param, i)
		call := &wirepb.ToolCall{Index: int32(i), Id: tc.ID, Name: tc.Function.Name, ArgumentsJson: []byte(tc.Function.Arguments)}
		switch {
		case tc.Type == "custom" || tc.Type == "" && tc.Custom != nil:
			if tc.Custom == nil || tc.Custom.Name == "" {
				return nil, invalid(p+".custom.name", "A custom tool call needs the custom tool's name.")
			}
			call.Name, call.ArgumentsJson = tools.flatName(toolCustom, "", tc.Custom.Name), customArguments(tc.Custom.Input)
		case tc.Type != "" && tc.Type != "function":
			return nil, invalid(p+".type", "Unsupported tool call type %q.", tc.Type)
		case tc.Function.Name == "":
			return nil, invalid(p+".function.name", "A tool call needs a function name.")
		}
		wm.ToolCalls = append(wm.ToolCalls, call)
	}
	return wm, nil
}

// content sets wm's text and images from m's content: a string, null (an
// assistant message with tool calls), or an array of text and image parts.
// Text parts are joined with newlines; images must be data URLs, since the
// Node may not reach the client's network.
func (m *message) content(wm *wirepb.ChatMessage, param string) *frontend.Failure {
	c := m.Content
	if len(c) == 0 || bytes.Equal(c, []byte("null")) {
		if m.Role == "assistant" {
			return nil
		}
		return invalid(param, "A %s message needs content.", m.Role)
	}
	if c[0] == '"' {
		if err := json.Unmarshal(c, &wm.Content); err != nil {
			return invalid(param, "content is not a valid string.")
		}
		return nil
	}
	var parts partList
	if err := json.Unmarshal(c, &parts); err != nil {
		var le *frontdoor.ListTooLong
		if errors.As(err, &le) {
			return invalid(param, "Too many content parts: at most %d are accepted.", le.Max)
		}
		return invalid(param, "content must be a string or an array of content parts.")
	}
	var texts []string
	for j, p := range parts {
		pp := fmt.Sprintf("%s[%d]", param, j)
		switch p.Type {
		case "text":
			texts = append(texts, p.Text)
		case "refusal":
			texts = append(texts, p.Refusal)
		case "image_url":
			if p.ImageURL == nil {
				return invalid(pp+".image_url", "An image_url part needs an image_url.")
			}
			img, e := decodeDataURL(p.ImageURL.URL, pp+".image_url.url")
			if e != nil {
				return e
			}
			wm.Images = append(wm.Images, img)
		default:
			return invalid(pp+".type", "Unsupported content part type %q: expected text or image_url.", p.Type)
		}
	}
	wm.Content = strings.Join(texts, "\n")
	return nil
}

// decodeDataURL returns the bytes of a base64 data URL
// ("data:image/png;base64,...").
func decodeDataURL(u, param string) ([]byte, *frontend.Failure) {
	rest, ok := strings.CutPrefix(u, "data:")
	if !ok {
		return nil, invalid(param, "Only data URLs (data:image/...;base64,...) are supported for images.")
	}
	meta, data, ok := strings.Cut(rest, ",")
	if !ok || !strings.HasSuffix(meta, ";base64") {
		return nil, invalid(param, "An image data URL must be base64-encoded.")
	}
	img, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		if img, err = base64.RawStdEncoding.DecodeString(data); err != nil {
			return nil, invalid(param, "The image data URL is not valid base64.")
		}
	}
	return img, nil
}
