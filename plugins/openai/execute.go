package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/iop-dev/iop/sdk"
)

// Wire shapes of a streamed answer.
type (
	chunkToolCall struct {
		Index    *int   `json:"index"`
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	chunkDelta struct {
		Content *string `json:"content"`
		Refusal *string `json:"refusal"`
		// ReasoningContent is vLLM's, DeepSeek's and llama.cpp's name for
		// the thinking; Reasoning is newer vLLM's and OpenRouter's.
		ReasoningContent *string         `json:"reasoning_content"`
		Reasoning        *string         `json:"reasoning"`
		ToolCalls        []chunkToolCall `json:"tool_calls"`
	}
	wireUsage struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	}
	chunk struct {
		Choices []struct {
			Index        int        `json:"index"`
			Delta        chunkDelta `json:"delta"`
			Message      chunkDelta `json:"message"` // the non-streaming shape
			Text         *string    `json:"text"`    // a text completion's
			FinishReason *string    `json:"finish_reason"`
		} `json:"choices"`
		Usage *wireUsage      `json:"usage"`
		Error json.RawMessage `json:"error"`
	}
)

// Execute runs req as a streaming chat completion, sending its deltas to
// out as they arrive. Cancelling ctx closes the upstream request at once.
func (a *Adapter) Execute(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	c, err := a.config()
	if err != nil {
		return nil, err
	}
	body, err := buildBody(req, c.systemTurns)
	if err != nil {
		return nil, err
	}
	return a.stream(ctx, c, "/chat/completions", body, req.Credential, out, httpError)
}

// stream posts body to path under base_url for a streamed answer and reads
// it: server-sent events of chunks, or one whole answer from a server that
// ignored "stream". failed maps an HTTP error answer.
func (a *Adapter) stream(ctx context.Context, c *config, path string, body []byte, cred *sdk.Credential, out sdk.EventSink,
	failed func(*http.Response) error) (*sdk.Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := a.post(ctx, c, path, body, cred, "text/event-stream")
	if err != nil {
		return nil, err
	}
	// Closing an unfinished body closes the connection: on every early
	// return (cancel, host gone, error) the server sees the client leave.
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, failed(resp)
	}
	r := &reader{out: out, calls: map[int]*callState{}}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/json" {
		// A server (or proxy) that ignored "stream": one whole answer.
		return r.whole(ctx, resp.Body)
	}
	return r.stream(ctx, resp.Body)
}

// post sends body as JSON to path under base_url, accepting accept, with
// the run's credential. The caller closes the response's body.
func (a *Adapter) post(ctx context.Context, c *config, path string, body []byte, cred *sdk.Credential, accept string) (*http.Response, error) {
	return a.postTo(ctx, c, c.endpoint(path), body, cred, accept)
}

// postTo is post to an absolute URL on the server.
func (a *Adapter) postTo(ctx context.Context, c *config, url string, body []byte, cred *sdk.Credential, accept string) (*http.Response, error) {
	hreq, err := c.newRequestTo(ctx, http.MethodPost, url, cred)
	if err != nil {
		return nil, err
	}
	hreq.Body = io.NopCloser(bytes.NewReader(body))
	hreq.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	hreq.ContentLength = int64(len(body))
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", accept)
	resp, err := a.client.Do(hreq)
	if err != nil {
		return nil, transportError(ctx, err)
	}
	return resp, nil
}

// reader turns the chunks of one answer into events.
type reader struct {
	out    sdk.EventSink
	finish string
	usage  *sdk.Usage
	// calls tracks each tool call by index so that its id and name are
	// sent once, in its first delta, even from servers that repeat them
	// in every fragment; later deltas carry argument fragments only.
	calls   map[int]*callState
	byID    map[string]int
	lastIdx int
}

type callState struct{ id, name string }

func (r *reader) stream(ctx context.Context, body io.Reader) (*sdk.Result, error) {
	sse := newSSEReader(body)
	done := false
	for !done {
		ev, err := sse.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, readError(ctx, err)
		}
		if ev.Data == "[DONE]" {
			done = true
			break
		}
		if ev.Event == "error" {
			e, _ := parseErrorBody([]byte(ev.Data))
			if e.Message == "" {
				e.Message = clip(ev.Data)
			}
			return nil, streamError(e)
		}
		if err := r.chunk(ctx, []byte(ev.Data)); err != nil {
			return nil, err
		}
	}
	if !done && r.finish == "" {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("openai: %w", ctx.Err())
		}
		return nil, &sdk.Error{Kind: sdk.KindUnavailable, Message: "openai: the stream ended before the answer was complete"}
	}
	return r.result(), nil
}

func (r *reader) whole(ctx context.Context, body io.Reader) (*sdk.Result, error) {
	b, err := io.ReadAll(body)
	if err != nil {
		return nil, readError(ctx, err)
	}
	if err := r.chunk(ctx, b); err != nil {
		return nil, err
	}
	return r.result(), nil
}

func (r *reader) result() *sdk.Result {
	reason := r.finish
	if reason == "" {
		// The stream ended cleanly with [DONE] but named no reason.
		reason = "stop"
	}
	return &sdk.Result{DoneReason: reason, Usage: r.usage}
}

// readError classifies a failure while reading the answer.
func readError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("openai: %w", ctx.Err())
	}
	if errors.Is(err, errEventTooLarge) {
		return &sdk.Error{Kind: sdk.KindUpstream, Message: "openai: " + err.Error(), Err: err}
	}
	return &sdk.Error{Kind: sdk.KindUnavailable, Message: "openai: connection lost mid-answer: " + describeNetError(err), Err: err}
}

// chunk decodes one chunk and sends its events: reasoning, text, tool-call
// fragments, then usage.
func (r *reader) chunk(ctx context.Context, data []byte) error {
	var ch chunk
	if err := json.Unmarshal(data, &ch); err != nil {
		return &sdk.Error{Kind: sdk.KindUpstream, Message: "openai: malformed chunk from the server: " + err.Error()}
	}
	if len(ch.Error) > 0 && string(ch.Error) != "null" {
		e, _ := parseErrorBody(data)
		return streamError(e)
	}
	for _, choice := range ch.Choices {
		if choice.Index != 0 {
			continue // only one choice is asked for
		}
		for _, d := range []chunkDelta{choice.Delta, choice.Message, {Content: choice.Text}} {
			if err := r.delta(ctx, d); err != nil {
				return err
			}
		}
		if choice.FinishReason != nil && *choice.FinishReason != "" {
			r.finish = *choice.FinishReason
		}
	}
	if ch.Usage != nil {
		u := &sdk.Usage{PromptTokens: ch.Usage.PromptTokens, CompletionTokens: ch.Usage.CompletionTokens}
		r.usage = u
		if err := r.out.Send(ctx, sdk.Event{Kind: sdk.UsageReport, Usage: &sdk.Usage{
			PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens,
		}}); err != nil {
			return err
		}
	}
	return nil
}

func (r *reader) delta(ctx context.Context, d chunkDelta) error {
	reasoning := d.ReasoningContent
	if reasoning == nil || *reasoning == "" {
		reasoning = d.Reasoning
	}
	if reasoning != nil && *reasoning != "" {
		if err := r.out.Send(ctx, sdk.Event{Kind: sdk.ReasoningDelta, Text: *reasoning}); err != nil {
			return err
		}
	}
	for _, text := range []*string{d.Content, d.Refusal} {
		if text != nil && *text != "" {
			if err := r.out.Send(ctx, sdk.Event{Kind: sdk.TextDelta, Text: *text}); err != nil {
				return err
			}
		}
	}
	for _, tc := range d.ToolCalls {
		call := r.toolCall(tc)
		if call == nil {
			continue
		}
		if err := r.out.Send(ctx, sdk.Event{Kind: sdk.ToolCallDelta, ToolCall: call}); err != nil {
			return err
		}
	}
	return nil
}

// toolCall normalizes one tool-call fragment: its index (servers that omit
// it get one per distinct id), and its id and name only the first time they
// are seen. It returns nil for a fragment that adds nothing.
func (r *reader) toolCall(tc chunkToolCall) *sdk.ToolCall {
	idx := r.lastIdx
	switch {
	case tc.Index != nil:
		idx = *tc.Index
	case tc.ID != "":
		if r.byID == nil {
			r.byID = map[string]int{}
		}
		i, ok := r.byID[tc.ID]
		if !ok {
			i = len(r.calls)
			r.byID[tc.ID] = i
		}
		idx = i
	}
	r.lastIdx = idx
	st := r.calls[idx]
	if st == nil {
		st = &callState{}
		r.calls[idx] = st
	}
	call := &sdk.ToolCall{Index: idx, Arguments: tc.Function.Arguments}
	if tc.ID != "" && st.id == "" {
		st.id, call.ID = tc.ID, tc.ID
	}
	if tc.Function.Name != "" && st.name == "" {
		st.name, call.Name = tc.Function.Name, tc.Function.Name
	}
	if call.ID == "" && call.Name == "" && call.Arguments == "" {
		return nil
	}
	return call
}
