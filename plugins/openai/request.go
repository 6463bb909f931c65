package openai

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"net/http"

	"github.com/iop-dev/iop/sdk"
)

// Wire shapes of a chat completions request.
type (
	wireFunctionCall struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	wireToolCall struct {
		ID       string           `json:"id,omitempty"`
		Type     string           `json:"type"`
		Function wireFunctionCall `json:"function"`
	}
	wireContentPart struct {
		Type     string        `json:"type"`
		Text     string        `json:"text,omitempty"`
		ImageURL *wireImageURL `json:"image_url,omitempty"`
	}
	wireImageURL struct {
		URL string `json:"url"`
	}
	wireMessage struct {
		Role string `json:"role"`
		// Content is a string, a list of parts (with images), or null
		// (an assistant message that only calls tools).
		Content    any            `json:"content"`
		ToolCalls  []wireToolCall `json:"tool_calls,omitempty"`
		ToolCallID string         `json:"tool_call_id,omitempty"`
	}
	wireFunction struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	}
	wireTool struct {
		Type     string       `json:"type"`
		Function wireFunction `json:"function"`
	}
)

// reservedKeys are body keys that shape the answer the adapter reads:
// Options.Extra may not set them, or the answer would no longer be one
// stream of one choice it can read.
var reservedKeys = map[string]bool{
	"model": true, "messages": true, "tools": true, "stream": true, "stream_options": true, "n": true,
}

// buildBody returns the JSON body of a streaming chat completion for req,
// its system turns as turns says (systemturns.go).
//
// The token limit is sent as max_tokens, which every OpenAI-compatible
// server we target (vLLM, llama.cpp, LM Studio, Ollama) accepts; OpenAI's
// own reasoning models want max_completion_tokens, which a caller can pass
// in Options.Extra instead (without MaxTokens). Options.ReasoningEffort is
// sent as reasoning_effort (see reasoningEffort); Options.Think alone has
// no portable field and is not sent (pass e.g. vLLM's
// chat_template_kwargs in Extra). Message.Reasoning is not replayed: chat
// completions has no standard field for it.
//
// Options.Extra's fields are merged into the body (SPEC P2): top_k,
// min_p, chat_template_kwargs, a vendor's own fields reach the server as
// the client sent them. A field the adapter sets from the run (the
// normalized options, tool_choice) wins over the same name in Extra, and
// Extra may not set a reserved key (see mergeExtra).
//
// Options.ToolChoice is sent in OpenAI's form ("auto", "none",
// "required", {"type":"function","function":{"name":...}}), and only with
// tools: OpenAI refuses tool_choice without them, and auto or none without
// tools is what the server does anyway.
func buildBody(req *sdk.Request, turns systemTurns) ([]byte, error) {
	if req.Target == "" {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "openai: the run names no target model")
	}
	msgs, err := wireMessages(req.Messages, turns, true)
	if err != nil {
		return nil, err
	}
	body := map[string]any{
		"model":          req.Target,
		"messages":       msgs,
		"stream":         true,
		"stream_options": map[string]bool{"include_usage": true},
	}
	if len(req.Tools) > 0 {
		tools, err := wireTools(req.Tools)
		if err != nil {
			return nil, err
		}
		body["tools"] = tools
	}
	if err := req.Options.ToolChoice.Check(req.Tools); err != nil {
		return nil, err
	}
	if tc := toolChoice(req.Options.ToolChoice); tc != nil && len(req.Tools) > 0 {
		body["tool_choice"] = tc
	}
	if e := req.Options.ReasoningEffort; e != "" {
		effort, err := reasoningEffort(e)
		if err != nil {
			return nil, err
		}
		body["reasoning_effort"] = effort
	}
	if err := setOptions(body, req.Options, reservedKeys); err != nil {
		return nil, err
	}
	return json.Marshal(body)
}

// reasoningEffort maps a run's effort level to reasoning_effort. OpenAI
// takes none, minimal, low, medium, high and xhigh (which of them depends
// on the model); current vLLM takes the same and max (DeepSeek's); Ollama's
// OpenAI API takes them all, mapped to its think levels; llama.cpp's
// server and LM Studio ignore a level their template does not use. Every
// level passes under its own name but max, sent as xhigh, the top level
// that OpenAI, vLLM and Ollama all know. A server that does not take a
// level (an older vLLM takes only low, medium and high) refuses the run as
// it would refuse the client, with 400.
func reasoningEffort(level string) (string, error) {
	switch level {
	case sdk.EffortNone, sdk.EffortMinimal, sdk.EffortLow, sdk.EffortMedium, sdk.EffortHigh:
		return level, nil
	case sdk.EffortMax:
		return "xhigh", nil
	}
	return "", sdk.Errorf(sdk.KindInvalidRequest, "openai: unknown reasoning effort %q", level)
}

// wireTools are the run's tools in OpenAI's form.
func wireTools(tools []sdk.Tool) ([]wireTool, error) {
	out := make([]wireTool, 0, len(tools))
	for i, t := range tools {
		if t.Name == "" {
			return nil, sdk.Errorf(sdk.KindInvalidRequest, "openai: tools[%d]: no name", i)
		}
		if len(t.Parameters) > 0 && !json.Valid(t.Parameters) {
			return nil, sdk.Errorf(sdk.KindInvalidRequest, "openai: tools[%d] (%s): parameters are not valid JSON", i, t.Name)
		}
		out = append(out, wireTool{Type: "function", Function: wireFunction{
			Name: t.Name, Description: t.Description, Parameters: t.Parameters,
		}})
	}
	return out, nil
}

// wireMessages are msgs in OpenAI's form, their system turns as turns
// says (systemturns.go), with their images when withImages. An error
// names the run's message it is about.
func wireMessages(msgs []sdk.Message, turns systemTurns, withImages bool) ([]wireMessage, error) {
	sent, from := turns.apply(msgs)
	out := make([]wireMessage, 0, len(sent))
	for i, m := range sent {
		if !withImages {
			m.Images = nil
		}
		wm, err := wireMessageOf(m)
		if err != nil {
			return nil, sdk.Errorf(sdk.KindInvalidRequest, "openai: messages[%d]: %s", from[i], err.Message)
		}
		out = append(out, wm)
	}
	return out, nil
}

func wireMessageOf(m sdk.Message) (wireMessage, *sdk.Error) {
	wm := wireMessage{Role: m.Role, Content: m.Content}
	switch m.Role {
	case "system", "user":
	case "assistant":
		for _, tc := range m.ToolCalls {
			args := tc.Arguments
			if args == "" {
				args = "{}"
			}
			wm.ToolCalls = append(wm.ToolCalls, wireToolCall{
				ID: tc.ID, Type: "function", Function: wireFunctionCall{Name: tc.Name, Arguments: args},
			})
		}
		if m.Content == "" && len(wm.ToolCalls) > 0 {
			wm.Content = nil
		}
	case "tool":
		if m.ToolCallID == "" {
			return wm, sdk.Errorf(sdk.KindInvalidRequest, "a tool message needs the id of the call it answers")
		}
		wm.ToolCallID = m.ToolCallID
	default:
		return wm, sdk.Errorf(sdk.KindInvalidRequest, "unknown role %q", m.Role)
	}
	if len(m.Images) > 0 {
		if m.Role != "user" {
			return wm, sdk.Errorf(sdk.KindInvalidRequest, "images are only accepted on user messages")
		}
		parts := []wireContentPart{}
		if m.Content != "" {
			parts = append(parts, wireContentPart{Type: "text", Text: m.Content})
		}
		for _, img := range m.Images {
			parts = append(parts, wireContentPart{Type: "image_url", ImageURL: &wireImageURL{URL: dataURL(img)}})
		}
		wm.Content = parts
	}
	return wm, nil
}

// dataURL encodes an image as a data URL, its media type sniffed from its
// bytes.
func dataURL(img []byte) string {
	return "data:" + http.DetectContentType(img) + ";base64," + base64.StdEncoding.EncodeToString(img)
}

// setOptions sets the normalized options in body, then merges
// Options.Extra, which may not set a reserved key.
func setOptions(body map[string]any, o sdk.Options, reserved map[string]bool) error {
	if o.Temperature != nil {
		body["temperature"] = *o.Temperature
	}
	if o.TopP != nil {
		body["top_p"] = *o.TopP
	}
	if o.MaxTokens != nil {
		if *o.MaxTokens <= 0 {
			return sdk.Errorf(sdk.KindInvalidRequest, "openai: max tokens must be positive, got %d", *o.MaxTokens)
		}
		body["max_tokens"] = *o.MaxTokens
	}
	if len(o.Stop) > 0 {
		body["stop"] = o.Stop
	}
	if o.Seed != nil {
		body["seed"] = *o.Seed
	}
	rf, err := responseFormat(o.Format, o.FormatName, o.FormatStrict)
	if err != nil {
		return err
	}
	if rf != nil {
		body["response_format"] = rf
	}
	return mergeExtra(body, o.Extra, reserved)
}

// responseFormat maps Options.Format: "json" to {"type":"json_object"}, a
// JSON schema to {"type":"json_schema","json_schema":{"name":NAME,
// "schema":...,"strict":true}} (NAME the client's, "response" when it gave
// none; strict only when asked), and nothing to nil.
func responseFormat(format json.RawMessage, name string, strict bool) (any, error) {
	f := bytes.TrimSpace(format)
	if len(f) == 0 || string(f) == "null" || string(f) == `""` {
		return nil, nil
	}
	var word string
	if json.Unmarshal(f, &word) == nil {
		if word == "json" {
			return map[string]string{"type": "json_object"}, nil
		}
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "openai: format %q: want \"json\" or a JSON schema object", word)
	}
	var schema map[string]json.RawMessage
	if err := json.Unmarshal(f, &schema); err != nil {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "openai: format is neither \"json\" nor a JSON schema object")
	}
	js := map[string]any{"name": cmp.Or(name, "response"), "schema": json.RawMessage(f)}
	if strict {
		js["strict"] = true
	}
	return map[string]any{"type": "json_schema", "json_schema": js}, nil
}

// toolChoice returns OpenAI's form of c, or nil for "" (the server's
// default). c has passed Check.
func toolChoice(c sdk.ToolChoice) any {
	if name, ok := c.Function(); ok {
		return map[string]any{"type": "function", "function": map[string]string{"name": name}}
	}
	if c == "" {
		return nil
	}
	return string(c)
}

// mergeExtra merges the keys of the JSON object extra into body: a key the
// adapter has set already (from the run's normalized fields) keeps its
// value, since the host interpreted and validated it; a reserved key is
// refused.
func mergeExtra(body map[string]any, extra json.RawMessage, reserved map[string]bool) error {
	e := bytes.TrimSpace(extra)
	if len(e) == 0 || string(e) == "null" {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(e, &m); err != nil {
		return sdk.Errorf(sdk.KindInvalidRequest, "openai: extra options must be a JSON object")
	}
	for k, v := range m {
		if reserved[k] {
			return sdk.Errorf(sdk.KindInvalidRequest, "openai: extra option %q is set by the adapter and cannot be replaced", k)
		}
		if _, set := body[k]; !set {
			body[k] = v
		}
	}
	return nil
}
