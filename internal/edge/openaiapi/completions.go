package openaiapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// POST /v1/completions, OpenAI's (legacy) text completions: a prompt in,
// its continuation out, and with a suffix the text between the two
// (fill-in-the-middle, for editor autocomplete). It is a normalized run
// whose request is a raw completion (RunRequest.completion), which only
// adapters with the "complete" capability run, each with its server's own
// completion: an OpenAI-compatible server's /v1/completions, Ollama's
// /api/generate. A model served by none of them is 400 unsupported, and so
// is a suffix on a provider that cannot fill in the middle. Its life is
// chat's; only the answer's shape differs: text_completion objects,
// streamed as chunks and [DONE], or whole.

// completionRequest is the part of a text completion request the Edge
// reads; the rest passes through (completionInterpreted).
type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Suffix        *string         `json:"suffix"`
	MaxTokens     *int64          `json:"max_tokens"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	N             *int64          `json:"n"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	Stop          json.RawMessage `json:"stop"`
	Seed          *int64          `json:"seed"`
	Echo          *bool           `json:"echo"`
}

// completionInterpreted are the fields of completionRequest; every other
// top-level field (best_of, logprobs, presence_penalty, frequency_penalty,
// logit_bias, user, a server's own) passes through to the provider.
var completionInterpreted = []string{
	"model", "prompt", "suffix", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed", "echo",
}

// parseCompletion decodes and validates a text completion request: 400
// naming the param at fault.
func parseCompletion(body []byte) (*parsedChat, *frontend.Failure) {
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, jsonError(err)
	}
	prompt, e := promptOf(req.Prompt)
	if e != nil {
		return nil, e
	}
	switch {
	case req.N != nil && *req.N != 1:
		return nil, invalid("n", "Only n=1 is supported.")
	case req.Echo != nil && *req.Echo:
		return nil, invalid("echo", "echo is not supported: the answer holds the completion only.")
	}
	run := &wirepb.RunRequest{Completion: &wirepb.CompletionInput{Prompt: prompt}, Options: &wirepb.RunOptions{}}
	if req.Suffix != nil {
		run.Completion.Suffix = *req.Suffix
	}
	// The sampling fields are chat's, validated as chat validates them.
	sampling := chatRequest{Temperature: req.Temperature, TopP: req.TopP, MaxTokens: req.MaxTokens, Stop: req.Stop, Seed: req.Seed}
	if e := sampling.options(run.Options); e != nil {
		return nil, e
	}
	if run.Options.ExtraJson, e = extraFieldsExcept(body, completionInterpreted); e != nil {
		return nil, e
	}
	return &parsedChat{
		model:        req.Model,
		stream:       req.Stream,
		includeUsage: req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		run:          run,
	}, nil
}

// promptOf reads prompt: a string, or an array of one string. Several
// prompts (a batch) and token arrays are refused, naming prompt.
func promptOf(raw json.RawMessage) (string, *frontend.Failure) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", invalid("prompt", "You must provide a prompt.")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one, nil
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return "", invalid("prompt", "prompt must be a string or an array of strings.")
	}
	switch {
	case len(list) == 0:
		return "", invalid("prompt", "[] is too short - 'prompt'")
	case json.Unmarshal(list[0], &one) != nil:
		return "", invalid("prompt", "Token arrays are not supported: send the prompt as text.")
	case len(list) > 1:
		return "", invalid("prompt", "Only one prompt per request is supported; send %d requests.", len(list))
	}
	return one, nil
}

// translateCompletion makes a text completion's run, written back as
// text_completion objects.
func translateCompletion(t *frontend.Turn) (frontend.Job, *frontend.Failure) {
	req, f := parseCompletion(t.Body)
	if f != nil {
		return nil, f
	}
	x := t.Exchange()
	out := &textOutput{resp: t.Response(), stream: req.stream, includeUsage: req.includeUsage,
		frame: textCompletion{Object: "text_completion", Created: x.Arrived().Unix(), Model: req.model, Choices: make([]textChoice, 1)}}
	if out.includeUsage {
		out.frame.Usage = json.RawMessage("null")
	}
	if req.stream {
		t.Response().Stream("text/event-stream", nil)
	}
	return req.job(out), nil
}

// Wire shapes of a text completion, as OpenAI sends them.
type (
	textCompletion struct {
		ID      string       `json:"id"`
		Object  string       `json:"object"`
		Created int64        `json:"created"`
		Model   string       `json:"model"`
		Choices []textChoice `json:"choices"`
		// Usage is null on every chunk but the last when usage was asked
		// for, absent otherwise; always there on an answer sent whole.
		Usage json.RawMessage `json:"usage,omitempty"`
	}
	textChoice struct {
		Text         string    `json:"text"`
		Index        int       `json:"index"`
		Logprobs     *struct{} `json:"logprobs"`
		FinishReason *string   `json:"finish_reason"`
	}
)

// textOutput writes a run's answer as a text completion: chunks and
// [DONE] (stream), or one object at the end.
type textOutput struct {
	resp         *frontend.Response
	stream       bool
	includeUsage bool
	frame        textCompletion
	usage        *wirepb.Usage
	whole        []byte // the answer, when sent whole
	buf          []byte
}

// Reasoning and tool calls have no place in a text completion: only the
// text is the answer.
func (t *textOutput) Reasoning(string) bool          { return true }
func (t *textOutput) ToolCall(*wirepb.ToolCall) bool { return true }
func (t *textOutput) Usage(u *wirepb.Usage)          { t.usage = u }
func (t *textOutput) Started(runID string)           { t.frame.ID = "cmpl-" + runID }
func (t *textOutput) Fail(f *frontend.Failure)       { t.resp.End(streamError(f)) }

var _ frontend.RunWriter = (*textOutput)(nil)

// Text relays a piece of the answer; false when the client could not be
// written to.
func (t *textOutput) Text(s string) bool {
	if s == "" {
		return true
	}
	if !t.stream {
		t.whole = append(t.whole, s...)
		t.resp.Progress()
		return true
	}
	t.frame.Choices[0] = textChoice{Text: s}
	return t.write(&t.frame)
}

// Complete ends the answer with its finish reason and usage.
func (t *textOutput) Complete(doneReason string) bool {
	finish := "stop"
	if doneReason == "length" || doneReason == "content_filter" {
		finish = doneReason
	}
	u, _ := json.Marshal(usageOf(t.usage))
	if !t.stream {
		whole := t.frame
		whole.Choices = []textChoice{{Text: string(t.whole), FinishReason: &finish}}
		whole.Usage = u
		return shape.WriteJSON(t.resp, http.StatusOK, whole)
	}
	t.frame.Choices[0] = textChoice{FinishReason: &finish}
	if !t.write(&t.frame) {
		return false
	}
	if t.includeUsage {
		last := t.frame
		last.Choices, last.Usage = []textChoice{}, u
		if !t.write(&last) {
			return false
		}
	}
	return t.resp.End(done)
}

// write sends c as one event.
func (t *textOutput) write(c *textCompletion) bool {
	b, err := json.Marshal(c)
	if err != nil { // only our own types: a bug
		panic(fmt.Sprintf("openaiapi: marshal text completion: %v", err))
	}
	t.buf = append(append(append(t.buf[:0], "data: "...), b...), "\n\n"...)
	return t.resp.Event(t.buf)
}
