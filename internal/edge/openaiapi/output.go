package openaiapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/edge/gateway"
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

// output writes a run's answer: as server-sent events as the events come
// (stream), or aggregated into one chat.completion at the end. Writes are
// the handler goroutine's, but for the keep-alive comments of a stream,
// which another goroutine writes while the handler waits: mu orders them.
type output struct {
	x            *exchange
	rc           *http.ResponseController
	stream       bool
	includeUsage bool
	frame        chunk
	buf          []byte
	usage        *wirepb.Usage

	mu        sync.Mutex
	started   bool      // the response is committed: its status and a byte have gone to the client
	roleSent  bool      // the stream's first chunk, with the role, went out
	errorSent bool      // the stream ended with an error event
	lastWrite time.Time // when anything last went to the client

	// callIDs are the ids of the tool calls seen, by index, so that a
	// call whose first fragment has no id gets one (clients answer a call
	// by its id).
	callIDs map[int32]string

	// The aggregate of a response sent whole.
	content, reasoningText strings.Builder
	calls                  []indexedCall
	callAt                 map[int32]int // index → position in calls
}

func newOutput(x *exchange) *output {
	o := &output{x: x, rc: http.NewResponseController(x.W), stream: x.req.stream, includeUsage: x.req.includeUsage,
		callIDs: map[int32]string{}, lastWrite: time.Now()}
	o.frame = chunk{Object: "chat.completion.chunk", Created: x.Arrived.Unix(), Model: x.req.model,
		Choices: make([]chunkChoice, 1)}
	if o.includeUsage {
		o.frame.Usage = json.RawMessage("null")
	}
	return o
}

// setID names the answer after its run, once there is one.
func (o *output) setID(runID string) { o.frame.ID = "chatcmpl-" + runID }

// keepAlive sends an SSE comment line (": keep-alive") whenever nothing
// has gone to the client for interval, until the returned stop is called
// (which waits for it). The first one commits the response, so a request
// waiting in the queue or in a silent prefill gets its headers and a line
// now and then, and proxies with a first-byte limit do not cut it;
// clients ignore comment lines. They are not answer bytes: the idle timer
// does not hear of them.
func (o *output) keepAlive(interval time.Duration) (stop func()) {
	if interval <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(interval / 4)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			o.mu.Lock()
			if !o.errorSent && time.Since(o.lastWrite) >= interval {
				o.x.BeforeWrite()
				if !o.started {
					o.commit()
				}
				_, _ = io.WriteString(o.x.W, ": keep-alive\n\n")
				_ = o.rc.Flush()
				o.lastWrite = time.Now()
			}
			o.mu.Unlock()
		}
	})
	return func() { close(done); wg.Wait() }
}

// Text relays a content delta. Like the other event methods it reports
// false when the client could not be written to.
func (o *output) Text(s string) bool {
	if s == "" {
		return true
	}
	if !o.stream {
		o.content.WriteString(s)
		o.x.Wrote()
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
		o.x.Wrote()
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
		o.x.Wrote()
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
		o.x.FirstByte()
		o.started = true
		o.x.BeforeWrite()
		writeJSON(o.x.W, http.StatusOK, completion{
			ID: o.frame.ID, Object: "chat.completion", Created: o.frame.Created, Model: o.frame.Model,
			Choices: []completionChoice{{Message: msg, FinishReason: finish}}, Usage: o.usageValue(),
		})
		return true
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
	return o.raw("data: [DONE]\n\n")
}

// streamError ends a stream that has started with an error event, then
// [DONE]: the client sees why the answer stopped, never a silent end.
func (o *output) streamError(e *apiError) {
	b, _ := json.Marshal(e.body())
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errorSent = true
	o.writeLocked([]byte("data: " + string(b) + "\n\ndata: [DONE]\n\n"))
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

func (o *output) usageValue() usage {
	u := usage{PromptTokens: o.usage.GetPromptTokens(), CompletionTokens: o.usage.GetCompletionTokens()}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
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

func (o *output) raw(s string) bool { return o.send([]byte(s)) }

// send writes p and flushes it, so the client has every event as soon as
// the Node sent it; before the first, the stream's first chunk, which
// carries only the role.
func (o *output) send(p []byte) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.roleSent {
		o.roleSent = true
		o.x.FirstByte()
		empty := ""
		role := o.frame
		role.Choices = []chunkChoice{{Delta: chunkDelta{Role: "assistant", Content: &empty}}}
		b, _ := json.Marshal(&role)
		if !o.writeLocked(append(append([]byte("data: "), b...), "\n\n"...)) {
			return false
		}
	}
	if !o.writeLocked(p) {
		return false
	}
	o.x.Wrote()
	return true
}

// writeLocked writes p and flushes it, committing the response first if
// it is not; it reports false when the client could not be written to.
// Callers hold mu.
func (o *output) writeLocked(p []byte) bool {
	o.x.BeforeWrite()
	if !o.started {
		o.commit()
	}
	if _, err := o.x.W.Write(p); err != nil {
		return false
	}
	if err := o.x.Flush(o.rc); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return false
	}
	o.lastWrite = time.Now()
	return true
}

// commit sends the 200 and the event-stream headers. It waits for the
// first event worth sending (or the first keep-alive), so that a run that
// fails before either is answered with an HTTP error instead. Callers hold
// mu.
func (o *output) commit() {
	o.started = true
	h := o.x.W.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // tell proxies not to buffer
	o.x.W.WriteHeader(http.StatusOK)
}

var _ gateway.RunWriter = (*output)(nil)
