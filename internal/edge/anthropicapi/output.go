package anthropicapi

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/edge/gateway"
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
// (stream), or as one message object at the end. Writes are the handler
// goroutine's, but for the pings of a stream, which another goroutine
// writes while the handler waits: mu orders them.
//
// Content blocks are sequential, as Anthropic sends them: a block starts
// when the run's output changes kind (thinking, text, a tool call of
// another index), and the block before it stops then. The one departure:
// a fragment of a tool call whose block has already stopped (a provider
// that interleaves the fragments of parallel calls) is still sent, as a
// delta of that block's index, where the SDKs' accumulators append it.
type output struct {
	x      *exchange
	rc     *http.ResponseController
	stream bool
	id     string // the message id, "msg_..."
	model  string // the model the client asked for

	blocks []*answerBlock
	open   int           // index of the block still open, -1 for none
	toolAt map[int32]int // tool call index → its block

	mu        sync.Mutex
	usage     *wirepb.Usage // written by the handler's goroutine under mu (setUsage)
	started   bool          // the response is committed: its status and message_start have gone out
	firstSent bool          // the first event of the answer (not a ping) went out
	ended     bool          // the stream ended (message_stop or an error event): nothing more is written
	lastWrite time.Time     // when anything last went to the client
	buf       []byte
}

func newOutput(x *exchange) *output {
	return &output{x: x, rc: http.NewResponseController(x.W), stream: x.req.stream, id: "msg_" + rand.Text(),
		model: x.req.model, open: -1, toolAt: map[int32]int{}, lastWrite: time.Now()}
}

// keepAlive sends a ping event whenever nothing has gone to the client
// for interval, until the returned stop is called (which waits for it).
// The first one commits the response (its status and message_start), so
// a request waiting in the queue or in a silent prefill gets its headers
// and an event now and then, and proxies with a first-byte limit do not
// cut it; clients skip pings. They are not answer bytes: the idle timer
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
			if !o.ended && time.Since(o.lastWrite) >= interval {
				_ = o.writeLocked([]byte("event: ping\ndata: {\"type\":\"ping\"}\n\n"))
			}
			o.mu.Unlock()
		}
	})
	return func() { close(done); wg.Wait() }
}

// setUsage records the run's usage, which message_start (written by
// whichever goroutine commits the stream) and the end carry.
func (o *output) Usage(u *wirepb.Usage) {
	o.mu.Lock()
	o.usage = u
	o.mu.Unlock()
}

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
		o.x.Wrote()
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
		o.x.Wrote()
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
		o.x.FirstByte()
		o.mu.Lock()
		o.started, o.ended = true, true
		o.mu.Unlock()
		o.x.BeforeWrite()
		writeJSON(o.x.W, http.StatusOK, msg)
		return true
	}
	if !o.stop() {
		return false
	}
	md := messageDelta{Type: "message_delta"}
	md.Delta.StopReason = reason
	md.Usage.InputTokens, md.Usage.OutputTokens = o.usage.GetPromptTokens(), o.usage.GetCompletionTokens()
	if !o.event("message_delta", md) {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ended = true
	return o.writeLocked([]byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))
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
// empty and no stop reason, as message_start carries it. Callers hold mu,
// or are the only writer.
func (o *output) message() messageObject {
	return messageObject{ID: o.id, Type: "message", Role: "assistant", Model: o.model, Content: []contentBlock{},
		Usage: usage{InputTokens: o.usage.GetPromptTokens(), OutputTokens: o.usage.GetCompletionTokens()}}
}

// committed reports whether the response has started: its status has
// gone to the client, and an error can only be an error event.
func (o *output) committed() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.started
}

// streamError ends a stream that has started with an error event: the
// client sees why the answer stopped, never a silent end.
func (o *output) streamError(e *apiError) {
	b, _ := json.Marshal(e.body())
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ended = true
	o.writeLocked(append(append([]byte("event: error\ndata: "), b...), "\n\n"...))
}

// event writes one event of the answer, named name with v as its data.
func (o *output) event(name string, v any) bool {
	b, err := json.Marshal(v)
	if err != nil { // only our own types: a bug
		panic(fmt.Sprintf("anthropicapi: marshal %s: %v", name, err))
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf = append(append(append(append(append(o.buf[:0], "event: "...), name...), "\ndata: "...), b...), "\n\n"...)
	if !o.firstSent {
		o.firstSent = true
		o.x.FirstByte()
	}
	if !o.writeEventLocked(o.buf) {
		return false
	}
	o.x.Wrote()
	return true
}

// writeLocked writes p and flushes it, committing the response first if
// it is not; it reports false when the client could not be written to.
// Callers hold mu.
func (o *output) writeLocked(p []byte) bool { return o.write(p, false) }

// writeEventLocked is writeLocked for an event of the run, on the relaying
// goroutine: its flush waits for the next event if that one is here
// already (gateway.Exchange.Flush). Callers hold mu.
func (o *output) writeEventLocked(p []byte) bool { return o.write(p, true) }

func (o *output) write(p []byte, event bool) bool {
	o.x.BeforeWrite()
	if !o.started && !o.commit() {
		return false
	}
	if _, err := o.x.W.Write(p); err != nil {
		return false
	}
	var err error
	if event {
		err = o.x.Flush(o.rc)
	} else {
		err = o.rc.Flush()
	}
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		return false
	}
	o.lastWrite = time.Now()
	return true
}

// commit sends the 200, the event-stream headers and message_start. It
// waits for the first event worth sending (or the first ping), so that a
// run that fails before either is answered with an HTTP error instead.
// Callers hold mu.
func (o *output) commit() bool {
	o.started = true
	h := o.x.W.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // tell proxies not to buffer
	o.x.W.WriteHeader(http.StatusOK)
	b, _ := json.Marshal(messageStart{Type: "message_start", Message: o.message()})
	_, err := io.WriteString(o.x.W, "event: message_start\ndata: "+string(b)+"\n\n")
	return err == nil
}

var _ gateway.RunWriter = (*output)(nil)
