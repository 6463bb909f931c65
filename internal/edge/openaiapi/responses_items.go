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

// Input items become the chat history a model server reads:
//
//	message                       a message; developer is system; text parts
//	                              (input_text, output_text, refusal) joined
//	                              with newlines; input_image as a data URL
//	reasoning                     the reasoning of the assistant message that
//	                              follows: its reasoning_text content, else its
//	                              summary; encrypted_content, OpenAI's sealed
//	                              reasoning no other model can read, is dropped
//	function_call                 a tool call of an assistant message, under the
//	                              name the model sees (a namespace's flat name)
//	custom_tool_call              a call of the custom tool's function, its input
//	                              as {"input": ...}
//	local_shell_call, shell_call, a call of the built-in's function, its action's
//	apply_patch_call              fields as the arguments
//	*_output                      a tool message answering call_id; a shell's
//	                              outputs as text (stdout, stderr, exit status)
//
// The items of one assistant turn (reasoning, then text, then calls, as a
// response's output lists them) join one assistant message, as a chat
// history has them; anything else starts a new message.

// respItem is one item of input; which fields count depends on Type.
type respItem struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"` // message: a string or parts; reasoning: parts
	Summary   respPartList    `json:"summary"` // reasoning
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Namespace string          `json:"namespace"`
	Arguments string          `json:"arguments"`
	Input     string          `json:"input"`  // custom_tool_call
	Output    json.RawMessage `json:"output"` // *_output: a string or parts (a shell's: its commands' outputs)
	Status    string          `json:"status"`
	Action    json.RawMessage `json:"action"`    // local_shell_call, shell_call
	Operation json.RawMessage `json:"operation"` // apply_patch_call
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

// historyBuilder turns input items into chat messages, naming tools as
// the run's tools do.
type historyBuilder struct {
	msgs  []*wirepb.ChatMessage
	tools *toolset
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
		return b.call(it, param, b.tools.flatName(toolFunction, it.Namespace, it.Name), []byte(it.Arguments))
	case "custom_tool_call":
		if it.CallID == "" {
			return invalid(param+".call_id", "A custom_tool_call item needs a call_id.")
		}
		if it.Name == "" {
			return invalid(param+".name", "A custom_tool_call item needs a name.")
		}
		return b.call(it, param, b.tools.flatName(toolCustom, it.Namespace, it.Name), customArguments(it.Input))
	case "function_call_output", "custom_tool_call_output", "apply_patch_call_output", "local_shell_call_output":
		return b.output(it, param)
	case "shell_call_output":
		if it.CallID == "" {
			return invalid(param+".call_id", "A shell_call_output item needs the call_id it answers.")
		}
		var outputs []shellOutput
		if given(it.Output) {
			if err := json.Unmarshal(it.Output, &outputs); err != nil {
				return invalid(param+".output", "The output of a shell_call_output item must be a list of {stdout, stderr, outcome}.")
			}
		}
		b.add(&wirepb.ChatMessage{Role: "tool", ToolCallId: it.CallID, Content: shellOutputText(outputs)})
		return nil
	case "item_reference":
		return invalid(param+".type", "item_reference items are not supported: the Edge keeps no stored items; send the item itself.")
	case "":
		return invalid(param+".type", "An input item needs a type (or a role, for a message).")
	}
	if bt := builtinCalls[kind]; bt != nil {
		raw := it.Action
		if bt.field == "operation" {
			raw = it.Operation
		}
		args, ok := bt.arguments(raw)
		if !ok {
			return invalid(param+"."+bt.field, "The %s of a %s item must be an object.", bt.field, kind)
		}
		return b.call(it, param, b.tools.flatName(toolBuiltin, "", bt.typ), args)
	}
	return invalid(param+".type", "Unsupported input item type %q: expected message, reasoning, function_call, "+
		"custom_tool_call, a client-run built-in tool's call, or their outputs.", kind)
}

// call adds a tool call of the model's, to the function named name, to
// the assistant message of its turn.
func (b *historyBuilder) call(it *respItem, param, name string, args []byte) *frontend.Failure {
	if it.CallID == "" {
		return invalid(param+".call_id", "A %s item needs a call_id.", it.Type)
	}
	if len(b.msgs) > 0 && len(b.msgs[len(b.msgs)-1].ToolCalls) == MaxToolCalls {
		return invalid(param, "Too many function calls in one turn: at most %d are accepted.", MaxToolCalls)
	}
	m := b.assistant(func(*wirepb.ChatMessage) bool { return true })
	m.ToolCalls = append(m.ToolCalls, &wirepb.ToolCall{Index: int32(len(m.ToolCalls)), Id: it.CallID, Name: name, ArgumentsJson: args})
	return nil
}

// output adds the tool message of a call's output: a string, or parts. A
// local_shell_call_output names its call by id (OpenAI's shape) or
// call_id; an apply_patch_call_output that failed says so.
func (b *historyBuilder) output(it *respItem, param string) *frontend.Failure {
	callID := it.CallID
	if callID == "" && it.Type == "local_shell_call_output" {
		callID = it.ID
	}
	if callID == "" {
		return invalid(param+".call_id", "A %s item needs the call_id it answers.", it.Type)
	}
	m := &wirepb.ChatMessage{Role: "tool", ToolCallId: callID, Name: it.Name}
	if e := partsInto(m, it.Output, param+".output"); e != nil {
		return e
	}
	if it.Type == "apply_patch_call_output" && it.Status == "failed" {
		m.Content = joinNonEmpty("The patch failed.", m.Content)
	}
	b.add(m)
	return nil
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
