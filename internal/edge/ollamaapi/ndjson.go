package ollamaapi

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Ollama's answer shapes, as its server writes them (api.ChatResponse and
// api.GenerateResponse, with api.Metrics inline).
type (
	chatLine struct {
		Model     string      `json:"model"`
		CreatedAt time.Time   `json:"created_at"`
		Message   lineMessage `json:"message"`
		lineEnd
	}
	generateLine struct {
		Model     string    `json:"model"`
		CreatedAt time.Time `json:"created_at"`
		Response  string    `json:"response"`
		Thinking  string    `json:"thinking,omitempty"`
		lineEnd
	}
	lineMessage struct {
		Role      string           `json:"role"`
		Content   string           `json:"content"`
		Thinking  string           `json:"thinking,omitempty"`
		ToolCalls []ollamaToolCall `json:"tool_calls,omitempty"`
	}
	// lineEnd is what the final line adds: done, the reason, the counts
	// and durations (nanoseconds).
	lineEnd struct {
		Done               bool   `json:"done"`
		DoneReason         string `json:"done_reason,omitempty"`
		TotalDuration      int64  `json:"total_duration,omitempty"`
		LoadDuration       int64  `json:"load_duration,omitempty"`
		PromptEvalCount    int64  `json:"prompt_eval_count,omitempty"`
		PromptEvalDuration int64  `json:"prompt_eval_duration,omitempty"`
		EvalCount          int64  `json:"eval_count,omitempty"`
		EvalDuration       int64  `json:"eval_duration,omitempty"`
	}
)

// ndjson writes a normalized run as Ollama's answer: a line per delta and
// the final done line (streamed), or one object at the end.
type ndjson struct {
	resp     *frontend.Response
	model    string
	arrived  time.Time
	stream   bool
	generate bool // /api/generate's shape (response), else /api/chat's (message)
	usage    *wirepb.Usage
	buf      []byte

	// The aggregate of an answer sent whole, and the tool calls, which
	// Ollama sends complete (arguments as an object), so they are gathered
	// by index from their fragments and sent before the done line.
	content, thinking strings.Builder
	calls             []gatheredCall
}

func newNDJSON(t *frontend.Turn, stream, generate bool) *ndjson {
	if stream {
		t.Response().Stream("application/x-ndjson", nil)
	}
	return &ndjson{resp: t.Response(), model: t.Plan.Model, arrived: t.Exchange().Arrived(), stream: stream, generate: generate}
}

type gatheredCall struct {
	index int32
	id    string
	name  string
	args  []byte
}

// delta relays content or thinking; it reports false when the client
// could not be written to.
func (o *ndjson) delta(content, thinking string) bool {
	if content == "" && thinking == "" {
		return true
	}
	if !o.stream {
		o.content.WriteString(content)
		o.thinking.WriteString(thinking)
		o.resp.Progress()
		return true
	}
	if o.generate {
		return o.line(&generateLine{Model: o.model, CreatedAt: time.Now().UTC(), Response: content, Thinking: thinking})
	}
	return o.line(&chatLine{Model: o.model, CreatedAt: time.Now().UTC(),
		Message: lineMessage{Role: "assistant", Content: content, Thinking: thinking}})
}

// Text, Reasoning, ToolCall, Usage and Complete write the run as a
// frontend.RunWriter.
func (o *ndjson) Text(s string) bool      { return o.delta(s, "") }
func (o *ndjson) Reasoning(s string) bool { return o.delta("", s) }
func (o *ndjson) ToolCall(tc *wirepb.ToolCall) bool {
	o.toolCall(tc)
	return true
}
func (o *ndjson) Usage(u *wirepb.Usage)           { o.usage = u }
func (o *ndjson) Complete(doneReason string) bool { return o.done(doneReason, o.usage) }
func (o *ndjson) Started(string)                  {}

// Fail ends a started stream with an error line: never a silent end.
func (o *ndjson) Fail(f *frontend.Failure) { o.resp.End(errorLine(f)) }

var _ frontend.RunWriter = (*ndjson)(nil)

// toolCall gathers a fragment of a tool call.
func (o *ndjson) toolCall(tc *wirepb.ToolCall) {
	if tc == nil {
		return
	}
	i := slices.IndexFunc(o.calls, func(c gatheredCall) bool { return c.index == tc.GetIndex() })
	if i < 0 {
		i = len(o.calls)
		o.calls = append(o.calls, gatheredCall{index: tc.GetIndex()})
	}
	c := &o.calls[i]
	if tc.GetId() != "" {
		c.id = tc.GetId()
	}
	if c.name == "" {
		c.name = tc.GetName()
	}
	c.args = append(c.args, tc.GetArgumentsJson()...)
	o.resp.Progress()
}

// gathered returns the tool calls in Ollama's shape. Arguments that are
// not a JSON object (a provider that cut them short) become {}.
func (o *ndjson) gathered() []ollamaToolCall {
	slices.SortStableFunc(o.calls, func(a, b gatheredCall) int { return int(a.index) - int(b.index) })
	out := make([]ollamaToolCall, 0, len(o.calls))
	for i, c := range o.calls {
		var tc ollamaToolCall
		tc.ID, tc.Function.Index, tc.Function.Name = c.id, i, c.name
		tc.Function.Arguments = json.RawMessage("{}")
		if a := strings.TrimSpace(string(c.args)); strings.HasPrefix(a, "{") && json.Valid([]byte(a)) {
			tc.Function.Arguments = json.RawMessage(a)
		}
		out = append(out, tc)
	}
	return out
}

// done writes the end: the tool calls, then the done line with reason
// and usage (streamed), or the whole answer (not streamed).
func (o *ndjson) done(reason string, u *wirepb.Usage) bool {
	if reason == "" || reason == "tool_calls" {
		reason = "stop" // Ollama says stop when it called tools
	}
	end := lineEnd{Done: true, DoneReason: reason,
		TotalDuration:   u.GetTotalDurationNs(),
		LoadDuration:    u.GetLoadDurationNs(),
		PromptEvalCount: u.GetPromptTokens(), PromptEvalDuration: u.GetPromptEvalDurationNs(),
		EvalCount: u.GetCompletionTokens(), EvalDuration: u.GetEvalDurationNs()}
	if end.TotalDuration == 0 && reason != "load" {
		end.TotalDuration = int64(time.Since(o.arrived))
	}
	now := time.Now().UTC()
	calls := o.gathered()
	if o.generate {
		l := &generateLine{Model: o.model, CreatedAt: now, lineEnd: end}
		if !o.stream {
			l.Response, l.Thinking = o.content.String(), o.thinking.String()
		}
		return o.line(l)
	}
	if o.stream && len(calls) > 0 {
		if !o.line(&chatLine{Model: o.model, CreatedAt: now, Message: lineMessage{Role: "assistant", ToolCalls: calls}}) {
			return false
		}
		calls = nil
	}
	l := &chatLine{Model: o.model, CreatedAt: now, Message: lineMessage{Role: "assistant", ToolCalls: calls}, lineEnd: end}
	if !o.stream {
		l.Message.Content, l.Message.Thinking = o.content.String(), o.thinking.String()
	}
	return o.line(l)
}

// line writes v as one line (or, not streamed, as the whole body) and
// flushes it; it reports false when the client could not be written to.
func (o *ndjson) line(v any) bool {
	b, err := json.Marshal(v)
	if err != nil { // only our own types: a bug
		panic("ollamaapi: marshal a line: " + err.Error())
	}
	o.buf = append(append(o.buf[:0], b...), '\n')
	if !o.stream {
		return o.resp.Whole(http.StatusOK, shape.ContentType, o.buf)
	}
	return o.resp.Event(o.buf)
}
