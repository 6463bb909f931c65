package openaiapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Wire shapes of answers, as OpenAI sends them.
type (
	chunk struct {
		ID      string        `json:"id"`
		Object  string        `json:"object"`
		Created int64         `json:"created"`
		Model   string        `json:"model"`
		Choices []chunkChoice `json:"choices"`
		// Usage is null on every chunk but the last when usage was asked
		// for, and absent otherwise, as OpenAI sends it.
		Usage json.RawMessage `json:"usage,omitempty"`
	}
	chunkChoice struct {
		Index        int        `json:"index"`
		Delta        chunkDelta `json:"delta"`
		Logprobs     *struct{}  `json:"logprobs"`
		FinishReason *string    `json:"finish_reason"`
	}
	chunkDelta struct {
		Role             string          `json:"role,omitempty"`
		Content          *string         `json:"content,omitempty"`
		ReasoningContent *string         `json:"reasoning_content,omitempty"`
		ToolCalls        []toolCallDelta `json:"tool_calls,omitempty"`
	}
	toolCallDelta struct {
		Index    int32          `json:"index"`
		ID       string         `json:"id,omitempty"`
		Type     string         `json:"type,omitempty"`
		Function *functionDelta `json:"function,omitempty"`
		Custom   *customCall    `json:"custom,omitempty"`
	}
	functionDelta struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	}
	// outToolCall is a tool call of an answer sent whole: a function's,
	// or a custom tool's.
	outToolCall struct {
		ID       string        `json:"id"`
		Type     string        `json:"type"`
		Function *functionCall `json:"function,omitempty"`
		Custom   *customCall   `json:"custom,omitempty"`
	}
	functionCall struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	customCall struct {
		Name  string `json:"name"`
		Input string `json:"input"`
	}
	usage struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
		TotalTokens      int64 `json:"total_tokens"`
	}
	completion struct {
		ID      string             `json:"id"`
		Object  string             `json:"object"`
		Created int64              `json:"created"`
		Model   string             `json:"model"`
		Choices []completionChoice `json:"choices"`
		Usage   usage              `json:"usage"`
	}
	completionChoice struct {
		Index        int              `json:"index"`
		Message      assistantMessage `json:"message"`
		Logprobs     *struct{}        `json:"logprobs"`
		FinishReason string           `json:"finish_reason"`
	}
	assistantMessage struct {
		Role             string        `json:"role"`
		Content          *string       `json:"content"`
		Refusal          *string       `json:"refusal"`
		ReasoningContent string        `json:"reasoning_content,omitempty"`
		ToolCalls        []outToolCall `json:"tool_calls,omitempty"`
	}
)

// output writes a chat run's answer: as server-sent events as the events
// come (stream), or aggregated into one chat.completion at the end.
type output struct {
	resp         *frontend.Response
	stream       bool
	includeUsage bool
	frame        chunk
	buf          []byte
	usage        *wirepb.Usage
	roleSent     bool // the stream's first chunk, with the role, went out

	// callIDs are the ids of the tool calls seen, by index, so that a
	// call whose first fragment has no id gets one (clients answer a call
	// by its id).
	callIDs map[int32]string
	// tools map a call back to the tool the client declared; a custom
	// tool's call is held (custom) until the end of the answer, when its
	// input is whole.
	tools  *toolset
	custom map[int32]*indexedCall

	// The aggregate of a response sent whole.
	content, reasoningText strings.Builder
	calls                  []indexedCall
	callAt                 map[int32]int // index → position in calls
}

func newOutput(x *frontend.Exchange, resp *frontend.Response, req *parsedChat) *output {
	o := &output{resp: resp, stream: req.stream, includeUsage: req.includeUsage, callIDs: map[int32]string{}, tools: req.tools}
	o.frame = chunk{Object: "chat.completion.chunk", Created: x.Arrived().Unix(), Model: req.model,
		Choices: make([]chunkChoice, 1)}
	if o.includeUsage {
		o.frame.Usage = json.RawMessage("null")
	}
	if o.stream {
		resp.Stream("text/event-stream", nil)
	}
	return o
}

// Started names the answer after its run.
func (o *output) Started(runID string) { o.frame.ID = "chatcmpl-" + runID }

// Text relays a content delta. Like the other event methods it reports
// false when the client could not be written to.
func (o *output) Text(s string) bool {
	if s == "" {
		return true
	}
	if !o.stream {
		o.content.WriteString(s)
		o.resp.Progress()
		return true
	}
	return o.delta(chunkDelta{Content: &s}, nil)
}

// Reasoning relays a reasoning delta as reasoning_content.
func (o *output) Reasoning(s string) bool {
	if s == "" {
		return true
	}
	if !o.stream {
		o.reasoningText.WriteString(s)
		o.resp.Progress()
		return true
	}
	return o.delta(chunkDelta{ReasoningContent: &s}, nil)
}

// ToolCall relays a tool-call delta: a complete call or a fragment of one,
// to be appended to the call of the same index. A custom tool's call is
// written once whole (as {"type":"custom","custom":{"name","input"}}), at
// the end: its input is a string the model writes as JSON arguments, whole
// only with their last fragment.
func (o *output) ToolCall(tc *wirepb.ToolCall) bool {
	if tc == nil {
		return true
	}
	id := tc.GetId()
	idx := tc.GetIndex()
	if _, seen := o.callIDs[idx]; !seen {
		if id == "" {
			id = fmt.Sprintf("call_%s_%d", strings.TrimPrefix(o.frame.ID, "chatcmpl-"), idx)
		}
		o.callIDs[idx] = id
		if d := o.tools.declared(tc.GetName()); d != nil && d.kind == toolCustom {
			if o.custom == nil {
				o.custom = map[int32]*indexedCall{}
			}
			o.custom[idx] = &indexedCall{index: idx, id: id, name: d.name, custom: true}
		}
	}
	if c := o.custom[idx]; c != nil {
		c.args = append(c.args, tc.GetArgumentsJson()...)
		o.resp.Progress()
		return true
	}
	if !o.stream {
		o.aggregate(tc, id)
		o.resp.Progress()
		return true
	}
	d := toolCallDelta{Index: idx, ID: id, Function: &functionDelta{Name: tc.GetName(), Arguments: string(tc.GetArgumentsJson())}}
	if d.ID != "" || d.Function.Name != "" {
		d.Type = "function"
	}
	return o.delta(chunkDelta{ToolCalls: []toolCallDelta{d}}, nil)
}

// indexedCall is a tool call being assembled from fragments.
type indexedCall struct {
	index  int32
	id     string
	name   string
	custom bool   // a custom tool's call, named by the client's name
	args   []byte // appended to, fragment by fragment; the call's arguments at the end
}

// wire is the call, whole.
func (c *indexedCall) wire() outToolCall {
	if c.custom {
		return outToolCall{ID: c.id, Type: "custom", Custom: &customCall{Name: c.name, Input: customInput(c.args)}}
	}
	return outToolCall{ID: c.id, Type: "function", Function: &functionCall{Name: c.name, Arguments: string(c.args)}}
}

// aggregate adds a fragment to the call of its index.
func (o *output) aggregate(tc *wirepb.ToolCall, id string) {
	if o.callAt == nil {
		o.callAt = map[int32]int{}
	}
	i, ok := o.callAt[tc.GetIndex()]
	if !ok {
		i = len(o.calls)
		o.callAt[tc.GetIndex()] = i
		o.calls = append(o.calls, indexedCall{index: tc.GetIndex()})
	}
	c := &o.calls[i]
	if id != "" {
		c.id = id
	}
	if n := tc.GetName(); n != "" && c.name == "" {
		c.name = n
	}
	c.args = append(c.args, tc.GetArgumentsJson()...)
}

// customCalls are the custom tools' calls, whole, by index.
func (o *output) customCalls() []*indexedCall {
	calls := make([]*indexedCall, 0, len(o.custom))
	for _, c := range o.custom {
		calls = append(calls, c)
	}
	slices.SortFunc(calls, func(a, b *indexedCall) int { return int(a.index) - int(b.index) })
	return calls
}

// Usage notes the run's usage, for the end.
func (o *output) Usage(u *wirepb.Usage) { o.usage = u }

// Complete ends the answer with its finish reason (and usage).
func (o *output) Complete(doneReason string) bool {
	finish := o.finishReason(doneReason)
	if !o.stream {
		msg := assistantMessage{Role: "assistant", ReasoningContent: o.reasoningText.String()}
		if s := o.content.String(); s != "" || len(o.calls)+len(o.custom) == 0 {
			msg.Content = &s
		}
		for _, c := range o.customCalls() {
			o.calls = append(o.calls, *c)
		}
		slices.SortStableFunc(o.calls, func(a, b indexedCall) int { return int(a.index) - int(b.index) })
		for i := range o.calls {
			msg.ToolCalls = append(msg.ToolCalls, o.calls[i].wire())
		}
		return shape.WriteJSON(o.resp, http.StatusOK, completion{
			ID: o.frame.ID, Object: "chat.completion", Created: o.frame.Created, Model: o.frame.Model,
			Choices: []completionChoice{{Message: msg, FinishReason: finish}}, Usage: o.usageValue(),
		})
	}
	for _, c := range o.customCalls() {
		call := c.wire()
		d := toolCallDelta{Index: c.index, ID: call.ID, Type: call.Type, Custom: call.Custom}
		if !o.delta(chunkDelta{ToolCalls: []toolCallDelta{d}}, nil) {
			return false
		}
	}
	if !o.delta(chunkDelta{}, &finish) {
		return false
	}
	if o.includeUsage {
		u, _ := json.Marshal(o.usageValue())
		last := o.frame
		last.Choices, last.Usage = []chunkChoice{}, u
		if !o.write(&last) {
			return false
		}
	}
	return o.resp.End(done)
}

// done ends every stream of this API.
var done = []byte("data: [DONE]\n\n")

// Fail ends a stream that has started with an error event, then [DONE]:
// the client sees why the answer stopped, never a silent end.
func (o *output) Fail(f *frontend.Failure) { o.resp.End(streamError(f)) }

// streamError is f as the last events of a stream: an error event, then
// [DONE].
func streamError(f *frontend.Failure) []byte {
	b, _ := json.Marshal(errorOf(f))
	return append(append(append([]byte("data: "), b...), "\n\n"...), done...)
}

// finishReason maps the Node's done reason to OpenAI's. A provider that
// answered with tool calls but says "stop" (as Ollama does) finishes with
// "tool_calls", which is what clients look for to run the tools.
func (o *output) finishReason(done string) string {
	switch done {
	case "length", "tool_calls", "content_filter":
		return done
	}
	if len(o.callIDs) > 0 {
		return "tool_calls"
	}
	return "stop"
}

func (o *output) usageValue() usage { return usageOf(o.usage) }

// usageOf is a run's usage in OpenAI's terms (zeros when the provider
// reported none).
func usageOf(u *wirepb.Usage) usage {
	v := usage{PromptTokens: u.GetPromptTokens(), CompletionTokens: u.GetCompletionTokens()}
	v.TotalTokens = v.PromptTokens + v.CompletionTokens
	return v
}

// delta writes one chunk with a delta (and a finish reason).
func (o *output) delta(d chunkDelta, finish *string) bool {
	o.frame.Choices[0] = chunkChoice{Delta: d, FinishReason: finish}
	return o.write(&o.frame)
}

// write sends c as one event, starting the stream first if it has not.
func (o *output) write(c *chunk) bool {
	b, err := json.Marshal(c)
	if err != nil { // only our own types: a bug
		panic(fmt.Sprintf("openaiapi: marshal chunk: %v", err))
	}
	o.buf = append(append(append(o.buf[:0], "data: "...), b...), "\n\n"...)
	return o.send(o.buf)
}

// send writes p as an event, after the stream's first chunk, which
// carries only the role.
func (o *output) send(p []byte) bool {
	if !o.roleSent {
		o.roleSent = true
		empty := ""
		role := o.frame
		role.Choices = []chunkChoice{{Delta: chunkDelta{Role: "assistant", Content: &empty}}}
		b, _ := json.Marshal(&role)
		if !o.resp.Event(append(append([]byte("data: "), b...), "\n\n"...)) {
			return false
		}
	}
	return o.resp.Event(p)
}

var _ frontend.RunWriter = (*output)(nil)
