package anthropicapi

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Wire shapes of answers, as Anthropic sends them.
type (
	messageObject struct {
		ID           string         `json:"id"`
		Type         string         `json:"type"`
		Role         string         `json:"role"`
		Model        string         `json:"model"`
		Content      []contentBlock `json:"content"`
		StopReason   *string        `json:"stop_reason"`
		StopSequence *string        `json:"stop_sequence"`
		Usage        usage          `json:"usage"`
	}
	// contentBlock is a block of an answer, or its empty start in a
	// content_block_start event: the fields its type has are set (a text
	// block's text may be ""), the others nil.
	contentBlock struct {
		Type      string          `json:"type"`
		Text      *string         `json:"text,omitempty"`
		Thinking  *string         `json:"thinking,omitempty"`
		Signature *string         `json:"signature,omitempty"`
		ID        string          `json:"id,omitempty"`
		Name      string          `json:"name,omitempty"`
		Input     json.RawMessage `json:"input,omitempty"`
	}
	usage struct {
		InputTokens              int64 `json:"input_tokens"`
		OutputTokens             int64 `json:"output_tokens"`
		CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	}
	// The events of a stream.
	messageStart struct {
		Type    string        `json:"type"`
		Message messageObject `json:"message"`
	}
	blockStart struct {
		Type         string       `json:"type"`
		Index        int          `json:"index"`
		ContentBlock contentBlock `json:"content_block"`
	}
	blockDelta struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
		Delta delta  `json:"delta"`
	}
	delta struct {
		Type        string  `json:"type"`
		Text        *string `json:"text,omitempty"`
		Thinking    *string `json:"thinking,omitempty"`
		PartialJSON *string `json:"partial_json,omitempty"`
	}
	blockStop struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
	}
	messageDelta struct {
		Type  string `json:"type"`
		Delta struct {
			StopReason   string  `json:"stop_reason"`
			StopSequence *string `json:"stop_sequence"`
		} `json:"delta"`
		Usage struct {
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
		} `json:"usage"`
	}
)

// Block kinds, as Anthropic names them.
const (
	kindText     = "text"
	kindThinking = "thinking"
	kindToolUse  = "tool_use"
)

// answerBlock is one content block of the answer, as it is built: its
// kind and, for a tool_use, the call it is; for an answer sent whole, its
// content too.
type answerBlock struct {
	kind     string
	id, name string          // a tool call's
	text     strings.Builder // text or thinking, when the answer is sent whole
	args     []byte          // tool input fragments, when the answer is sent whole
}

// output writes a run's answer: as server-sent events as the events come
// (stream), or as one message object at the end.
//
// Content blocks are sequential, as Anthropic sends them: a block starts
// when the run's output changes kind (thinking, text, a tool call of
// another index), and the block before it stops then. The one departure:
// a fragment of a tool call whose block has already stopped (a provider
// that interleaves the fragments of parallel calls) is still sent, as a
// delta of that block's index, where the SDKs' accumulators append it.
type output struct {
	resp   *frontend.Response
	stream bool
	id     string // the message id, "msg_..."
	model  string // the model the client asked for

	blocks []*answerBlock
	open   int           // index of the block still open, -1 for none
	toolAt map[int32]int // tool call index → its block

	// usage is the run's last usage: message_start carries it, which the
	// keep-alive's goroutine may write (the stream's preamble).
	usage atomic.Pointer[wirepb.Usage]
	buf   []byte
}

func newOutput(resp *frontend.Response, req *parsedMessages) *output {
	o := &output{resp: resp, stream: req.stream, id: "msg_" + rand.Text(), model: req.model, open: -1, toolAt: map[int32]int{}}
	if o.stream {
		// The stream opens with message_start, whoever commits it: the
		// first event, or a ping while the request waits.
		resp.Stream("text/event-stream", func() []byte {
			b, _ := json.Marshal(messageStart{Type: "message_start", Message: o.message()})
			return append(append([]byte("event: message_start\ndata: "), b...), "\n\n"...)
		})
	}
	return o
}

// Started: the message has its own id, not the run's.
func (o *output) Started(string) {}

// LogAttrs names the message in the request's log line.
func (o *output) LogAttrs() []slog.Attr { return []slog.Attr{slog.String("message_id", o.id)} }

// Usage records the run's usage, which message_start (written by
// whichever goroutine commits the stream) and the end carry.
func (o *output) Usage(u *wirepb.Usage) { o.usage.Store(u) }

// text relays a text delta, into a text block. Like the other event
// methods it reports false when the client could not be written to.
func (o *output) Text(s string) bool { return o.delta(kindText, s) }

// reasoning relays a reasoning delta, into a thinking block.
func (o *output) Reasoning(s string) bool { return o.delta(kindThinking, s) }

// delta relays s into the open block of kind, or a new one.
func (o *output) delta(kind, s string) bool {
	if s == "" {
		return true
	}
	b, at, ok := o.into(kind)
	if !ok {
		return false
	}
	if !o.stream {
		b.text.WriteString(s)
		o.resp.Progress()
		return true
	}
	d := delta{Type: "text_delta", Text: &s}
	if kind == kindThinking {
		d = delta{Type: "thinking_delta", Thinking: &s}
	}
	return o.event("content_block_delta", blockDelta{Type: "content_block_delta", Index: at, Delta: d})
}

// toolCall relays a tool-call fragment: the first of its index starts a
// tool_use block with the call's id (or one of ours, "toolu_...") and
// name; the arguments of every fragment are the block's input, as
// input_json_delta pieces.
func (o *output) ToolCall(tc *wirepb.ToolCall) bool {
	if tc == nil {
		return true
	}
	at, seen := o.toolAt[tc.GetIndex()]
	if !seen {
		b := &answerBlock{kind: kindToolUse, id: tc.GetId(), name: tc.GetName()}
		if b.id == "" {
			b.id = fmt.Sprintf("toolu_%s_%d", strings.TrimPrefix(o.id, "msg_"), tc.GetIndex())
		}
		o.toolAt[tc.GetIndex()] = len(o.blocks)
		var ok bool
		if _, at, ok = o.begin(b); !ok {
			return false
		}
	}
	b, args := o.blocks[at], tc.GetArgumentsJson()
	if len(args) == 0 {
		return true
	}
	if !o.stream {
		b.args = append(b.args, args...)
		o.resp.Progress()
		return true
	}
	s := string(args)
	return o.event("content_block_delta", blockDelta{Type: "content_block_delta", Index: at, Delta: delta{Type: "input_json_delta", PartialJSON: &s}})
}

// into returns the block the next text or thinking delta goes into, and
// its index: the open one if it is of that kind, else a new one. ok is
// false when the client could not be written to.
func (o *output) into(kind string) (b *answerBlock, at int, ok bool) {
	if o.open >= 0 && o.blocks[o.open].kind == kind {
		return o.blocks[o.open], o.open, true
	}
	return o.begin(&answerBlock{kind: kind})
}

// begin makes b the open block, after the open one is stopped.
func (o *output) begin(b *answerBlock) (_ *answerBlock, at int, ok bool) {
	if !o.stop() {
		return nil, 0, false
	}
	at = len(o.blocks)
	o.blocks, o.open = append(o.blocks, b), at
	if !o.stream {
		return b, at, true
	}
	return b, at, o.event("content_block_start", blockStart{Type: "content_block_start", Index: at, ContentBlock: b.content()})
}

// stop ends the open block, if there is one.
func (o *output) stop() bool {
	at := o.open
	if at < 0 {
		return true
	}
	o.open = -1
	if !o.stream {
		return true
	}
	return o.event("content_block_stop", blockStop{Type: "content_block_stop", Index: at})
}

// stopReason maps the Node's done reason to Anthropic's. A provider that
// answered with tool calls but says "stop" (as Ollama does) ends with
// tool_use, which is what clients look for to run the tools. A stop
// sequence cannot be told from the model's own end (neither Ollama nor
// the OpenAI chat API says which ended it): both are end_turn, and
// stop_sequence is always null.
func (o *output) stopReason(done string) string {
	switch {
	case done == "length":
		return "max_tokens"
	case done == "tool_calls" || len(o.toolAt) > 0:
		return "tool_use"
	case done == "content_filter":
		return "refusal"
	}
	return "end_turn"
}

// complete ends the answer: the last block's stop, message_delta with the
// stop reason and the usage, and message_stop; or, sent whole, the
// message object.
func (o *output) Complete(doneReason string) bool {
	reason := o.stopReason(doneReason)
	if !o.stream {
		msg := o.message()
		msg.StopReason = &reason
		for _, b := range o.blocks {
			msg.Content = append(msg.Content, b.content())
		}
		return shape.WriteJSON(o.resp, http.StatusOK, msg)
	}
	if !o.stop() {
		return false
	}
	md := messageDelta{Type: "message_delta"}
	md.Delta.StopReason = reason
	u := o.usage.Load()
	md.Usage.InputTokens, md.Usage.OutputTokens = u.GetPromptTokens(), u.GetCompletionTokens()
	if !o.event("message_delta", md) {
		return false
	}
	return o.resp.End([]byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))
}

// content is b as a block of a message sent whole, or, new, as the empty
// block a content_block_start carries. A tool call's input is its
// arguments when they are a JSON object, else {} (none yet, arguments cut
// off by max_tokens, or not JSON at all), as the SDKs' accumulators do. A
// thinking block's signature is empty: the Edge cannot sign a provider's
// reasoning as Anthropic signs Claude's, and ignores one sent back.
func (b *answerBlock) content() contentBlock {
	c := contentBlock{Type: b.kind}
	switch b.kind {
	case kindText:
		s := b.text.String()
		c.Text = &s
	case kindThinking:
		s := b.text.String()
		c.Thinking, c.Signature = &s, new(string)
	case kindToolUse:
		c.ID, c.Name, c.Input = b.id, b.name, json.RawMessage("{}")
		if args := bytes.TrimSpace(b.args); len(args) > 0 && args[0] == '{' && json.Valid(args) {
			c.Input = args
		}
	}
	return c
}

// message is the message object with what is known so far: its content
// empty and no stop reason, as message_start carries it.
func (o *output) message() messageObject {
	u := o.usage.Load()
	return messageObject{ID: o.id, Type: "message", Role: "assistant", Model: o.model, Content: []contentBlock{},
		Usage: usage{InputTokens: u.GetPromptTokens(), OutputTokens: u.GetCompletionTokens()}}
}

// Fail ends a stream that has started with an error event: the client
// sees why the answer stopped, never a silent end.
func (o *output) Fail(f *frontend.Failure) {
	b, _ := json.Marshal(errorOf(f))
	o.resp.End(append(append([]byte("event: error\ndata: "), b...), "\n\n"...))
}

// event writes one event of the answer, named name with v as its data.
func (o *output) event(name string, v any) bool {
	b, err := json.Marshal(v)
	if err != nil { // only our own types: a bug
		panic(fmt.Sprintf("anthropicapi: marshal %s: %v", name, err))
	}
	o.buf = append(append(append(append(append(o.buf[:0], "event: "...), name...), "\ndata: "...), b...), "\n\n"...)
	return o.resp.Event(o.buf)
}

var _ frontend.RunWriter = (*output)(nil)
