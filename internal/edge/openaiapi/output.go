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
		Index    int32         `json:"index"`
		ID       string        `json:"id,omitempty"`
		Type     string        `json:"type,omitempty"`
		Function functionDelta `json:"function"`
	}
	functionDelta struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
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
		Role             string     `json:"role"`
		Content          *string    `json:"content"`
		Refusal          *string    `json:"refusal"`
		ReasoningContent string     `json:"reasoning_content,omitempty"`
		ToolCalls        []toolCall `json:"tool_calls,omitempty"`
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

	// The aggregate of a response sent whole.
	content, reasoningText strings.Builder
	calls                  []indexedCall
	callAt                 map[int32]int // index → position in calls
}

func newOutput(x *frontend.Exchange, resp *frontend.Response, req *parsedChat) *output {
	o := &output{resp: resp, stream: req.stream, includeUsage: req.includeUsage, callIDs: map[int32]string{}}
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
// to be appended to the call of the same index.
func (o *output) ToolCall(tc *wirepb.ToolCall) bool {
	if tc == nil {
		return true
	}
	id := tc.GetId()
	if _, seen := o.callIDs[tc.GetIndex()]; !seen {
		if id == "" {
			id = fmt.Sprintf("call_%s_%d", strings.TrimPrefix(o.frame.ID, "chatcmpl-"), tc.GetIndex())
		}
		o.callIDs[tc.GetIndex()] = id
	}
	if !o.stream {
		o.aggregate(tc, id)
		o.resp.Progress()
		return true
	}
	d := toolCallDelta{Index: tc.GetIndex(), ID: id,
		Function: functionDelta{Name: tc.GetName(), Arguments: string(tc.GetArgumentsJson())}}
	if d.ID != "" || d.Function.Name != "" {
		d.Type = "function"
	}
	return o.delta(chunkDelta{ToolCalls: []toolCallDelta{d}}, nil)
}

// indexedCall is a tool call being assembled from fragments.
type indexedCall struct {
	index int32
	call  toolCall
	args  []byte // appended to, fragment by fragment; the call's arguments at the end
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
		o.calls = append(o.calls, indexedCall{index: tc.GetIndex(), call: toolCall{Type: "function"}})
	}
	c := &o.calls[i].call
	if id != "" {
		c.ID = id
	}
	if n := tc.GetName(); n != "" && c.Function.Name == "" {
		c.Function.Name = n
	}
	o.calls[i].args = append(o.calls[i].args, tc.GetArgumentsJson()...)
}

// Usage notes the run's usage, for the end.
func (o *output) Usage(u *wirepb.Usage) { o.usage = u }

// Complete ends the answer with its finish reason (and usage).
func (o *output) Complete(doneReason string) bool {
	finish := o.finishReason(doneReason)
	if !o.stream {
		msg := assistantMessage{Role: "assistant", ReasoningContent: o.reasoningText.String()}
		if s := o.content.String(); s != "" || len(o.calls) == 0 {
			msg.Content = &s
		}
		slices.SortStableFunc(o.calls, func(a, b indexedCall) int { return int(a.index) - int(b.index) })
		for _, c := range o.calls {
			c.call.Function.Arguments = string(c.args)
			msg.ToolCalls = append(msg.ToolCalls, c.call)
		}
		return shape.WriteJSON(o.resp, http.StatusOK, completion{
			ID: o.frame.ID, Object: "chat.completion", Created: o.frame.Created, Model: o.frame.Model,
			Choices: []completionChoice{{Message: msg, FinishReason: finish}}, Usage: o.usageValue(),
		})
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
