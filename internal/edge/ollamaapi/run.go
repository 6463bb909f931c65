package ollamaapi

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The Ollama API over every provider (SPEC P2, issue 11). A model one of
// whose candidates is an Ollama server is tunnelled to it byte-exact; any
// other model (a vLLM, a llama.cpp server, a hosted API, the simulator)
// answers /api/chat and /api/generate as a normalized run (R2), written back
// in Ollama's NDJSON: content, thinking and tool calls, then the final
// done:true line with done_reason, the token counts and the durations. A
// request that is not streamed gets one JSON object, as Ollama sends it. A
// generate with a suffix (fill-in-the-middle) or raw is a raw completion
// run (issue 12), for providers that complete.

// Bounds on what one request's JSON may make the Edge build (P3), as for
// the OpenAI API: counted as the body is decoded.
const (
	maxMessages  = 10_000
	maxTools     = 1_000
	maxToolCalls = 1_000
	maxImages    = 100
	maxOptions   = 100
)

type (
	ollamaChat struct {
		Model    string          `json:"model"`
		Messages messageList     `json:"messages"`
		Tools    toolList        `json:"tools"`
		Format   json.RawMessage `json:"format"`
		Options  json.RawMessage `json:"options"`
		Stream   *bool           `json:"stream"`
		Think    json.RawMessage `json:"think"`
	}
	ollamaGenerate struct {
		Model   string          `json:"model"`
		Prompt  string          `json:"prompt"`
		Suffix  string          `json:"suffix"`
		Raw     bool            `json:"raw"`
		System  string          `json:"system"`
		Images  imageList       `json:"images"`
		Format  json.RawMessage `json:"format"`
		Options json.RawMessage `json:"options"`
		Stream  *bool           `json:"stream"`
		Think   json.RawMessage `json:"think"`
	}
	ollamaMessage struct {
		Role       string       `json:"role"`
		Content    string       `json:"content"`
		Thinking   string       `json:"thinking"`
		Images     imageList    `json:"images"`
		ToolCalls  toolCallList `json:"tool_calls"`
		ToolName   string       `json:"tool_name"`
		ToolCallID string       `json:"tool_call_id"`
	}
	ollamaToolCall struct {
		ID       string `json:"id,omitempty"`
		Function struct {
			Index     int             `json:"index"`
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	}
	ollamaTool struct {
		Type     string `json:"type"`
		Function struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		} `json:"function"`
	}
	// Bounded lists: each decodes with frontdoor.DecodeList.
	messageList  []ollamaMessage
	toolList     []ollamaTool
	toolCallList []ollamaToolCall
	imageList    []string
)

func (l *messageList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[ollamaMessage](b, maxMessages, "messages")
	return err
}

func (l *toolList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[ollamaTool](b, maxTools, "tools")
	return err
}

func (l *toolCallList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[ollamaToolCall](b, maxToolCalls, "tool_calls")
	return err
}

func (l *imageList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[string](b, maxImages, "images")
	return err
}

// parsedRun is an Ollama request ready to run.
type parsedRun struct {
	stream bool
	load   bool // no messages (chat) or no prompt (generate): Ollama's "load the model" call
	run    *wirepb.RunRequest
}

// parseRun decodes a chat or generate body for a normalized run.
func parseRun(route string, body []byte) (*parsedRun, *frontend.Failure) {
	var (
		pr              = &parsedRun{run: &wirepb.RunRequest{Options: &wirepb.RunOptions{}}}
		stream          *bool
		format, options json.RawMessage
		think           json.RawMessage
	)
	decodeErr := func(err error) *frontend.Failure {
		var le *frontdoor.ListTooLong
		if errors.As(err, &le) {
			return invalid("too many %s: at most %d are accepted", le.Param, le.Max)
		}
		return invalid("%s", err.Error())
	}
	if route == routeChat {
		var req ollamaChat
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, decodeErr(err)
		}
		stream, format, options, think = req.Stream, req.Format, req.Options, req.Think
		pr.load = len(req.Messages) == 0
		for i := range req.Messages {
			m, e := req.Messages[i].toWire(i)
			if e != nil {
				return nil, e
			}
			pr.run.Messages = append(pr.run.Messages, m)
		}
		for i, t := range req.Tools {
			if t.Type != "" && t.Type != "function" || t.Function.Name == "" {
				return nil, invalid("tools[%d]: only function tools with a name are supported", i)
			}
			wt := &wirepb.Tool{Name: t.Function.Name, Description: t.Function.Description}
			if p := t.Function.Parameters; len(p) > 0 && string(p) != "null" {
				wt.ParametersJson = p
			}
			pr.run.Tools = append(pr.run.Tools, wt)
		}
	} else {
		var req ollamaGenerate
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, decodeErr(err)
		}
		stream, format, options, think = req.Stream, req.Format, req.Options, req.Think
		pr.load = req.Prompt == "" && len(req.Images) == 0
		if req.Suffix != "" || req.Raw {
			// Fill-in-the-middle, or the prompt as it is: a raw completion
			// (issue 12), which only a provider that completes runs (400
			// unsupported otherwise). It has no system message or images.
			if req.System != "" || len(req.Images) > 0 {
				return nil, frontend.Unsupported("", "system and images are not supported with suffix or raw on this model")
			}
			pr.run.Completion = &wirepb.CompletionInput{Prompt: req.Prompt, Suffix: req.Suffix}
		} else if e := req.toMessages(pr.run); e != nil {
			return nil, e
		}
	}
	pr.stream = stream == nil || *stream // Ollama streams unless told not to
	if e := runOptions(pr.run.Options, format, options, think); e != nil {
		return nil, e
	}
	return pr, nil
}

// toMessages makes a generate request's system prompt and prompt (with its
// images) the run's messages.
func (req *ollamaGenerate) toMessages(run *wirepb.RunRequest) *frontend.Failure {
	if req.System != "" {
		run.Messages = append(run.Messages, &wirepb.ChatMessage{Role: "system", Content: req.System})
	}
	user := &wirepb.ChatMessage{Role: "user", Content: req.Prompt}
	for j, img := range req.Images {
		b, e := decodeImage(img, fmt.Sprintf("images[%d]", j))
		if e != nil {
			return e
		}
		user.Images = append(user.Images, b)
	}
	run.Messages = append(run.Messages, user)
	return nil
}

// toWire converts message i.
func (m *ollamaMessage) toWire(i int) (*wirepb.ChatMessage, *frontend.Failure) {
	wm := &wirepb.ChatMessage{Role: m.Role, Content: m.Content, Reasoning: m.Thinking, Name: m.ToolName, ToolCallId: m.ToolCallID}
	switch m.Role {
	case "system", "user", "assistant", "tool":
	default:
		return nil, invalid("messages[%d]: unsupported role %q: expected system, user, assistant or tool", i, m.Role)
	}
	for j, img := range m.Images {
		b, e := decodeImage(img, fmt.Sprintf("messages[%d].images[%d]", i, j))
		if e != nil {
			return nil, e
		}
		wm.Images = append(wm.Images, b)
	}
	for j, tc := range m.ToolCalls {
		if tc.Function.Name == "" {
			return nil, invalid("messages[%d].tool_calls[%d]: a tool call needs a function name", i, j)
		}
		args := tc.Function.Arguments
		if len(args) == 0 || string(args) == "null" {
			args = json.RawMessage("{}")
		}
		wm.ToolCalls = append(wm.ToolCalls, &wirepb.ToolCall{Index: int32(j), Id: tc.ID, Name: tc.Function.Name, ArgumentsJson: args})
	}
	return wm, nil
}

// decodeImage decodes a base64 image, as Ollama sends them.
func decodeImage(s, param string) ([]byte, *frontend.Failure) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, invalid("%s: not valid base64", param)
	}
	return b, nil
}

// ollamaOptions are the sampling options of Ollama's `options` that a
// normalized run carries: the portable ones become RunOptions, the ones
// OpenAI-compatible servers also know travel in extra_json under those
// servers' names. Ollama's runtime options (num_ctx, num_gpu, num_thread,
// ...) mean nothing to the providers this path serves and are dropped.
var passThroughOptions = map[string]string{
	"top_k": "top_k", "min_p": "min_p", "typical_p": "typical_p",
	"repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
}

// runOptions fills o from Ollama's format, options and think.
func runOptions(o *wirepb.RunOptions, format, options, think json.RawMessage) *frontend.Failure {
	switch f := strings.TrimSpace(string(format)); {
	case f == "" || f == "null" || f == `""`:
	case f == `"json"`:
		o.Format = []byte("json")
	case strings.HasPrefix(f, "{"):
		o.Format = []byte(f)
	default:
		return invalid(`format must be "json" or a JSON schema`)
	}
	if len(think) > 0 && string(think) != "null" {
		var on bool
		var level string
		switch {
		case json.Unmarshal(think, &on) == nil:
		case json.Unmarshal(think, &level) == nil:
			on = level != "" && level != "none" // high, medium, low: on
		default:
			return invalid("think must be a boolean or one of high, medium, low")
		}
		o.Think = &on
	}
	if len(options) == 0 || string(options) == "null" {
		return nil
	}
	opts, err := boundedObject(options, maxOptions)
	if err != nil {
		return invalid("options: %v", err)
	}
	num := func(key string, into func(float64)) *frontend.Failure {
		raw, ok := opts[key]
		if !ok {
			return nil
		}
		var v float64
		if err := json.Unmarshal(raw, &v); err != nil {
			return invalid("options.%s must be a number", key)
		}
		into(v)
		return nil
	}
	for _, e := range []*frontend.Failure{
		num("temperature", func(v float64) { o.Temperature = &v }),
		num("top_p", func(v float64) { o.TopP = &v }),
		num("num_predict", func(v float64) {
			if n := int64(v); n > 0 { // -1 and -2 mean "no limit" to Ollama
				o.MaxTokens = &n
			}
		}),
		num("seed", func(v float64) { n := int64(v); o.Seed = &n }),
	} {
		if e != nil {
			return e
		}
	}
	if raw, ok := opts["stop"]; ok {
		if err := json.Unmarshal(raw, &o.Stop); err != nil {
			return invalid("options.stop must be an array of strings")
		}
	}
	extra := map[string]json.RawMessage{}
	for from, to := range passThroughOptions {
		if raw, ok := opts[from]; ok {
			extra[to] = raw
		}
	}
	if len(extra) > 0 {
		o.ExtraJson, _ = json.Marshal(extra)
	}
	return nil
}

// boundedObject decodes a JSON object of at most max keys.
func boundedObject(data []byte, max int) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("must be an object")
	}
	out := map[string]json.RawMessage{}
	for dec.More() {
		if len(out) == max {
			return nil, fmt.Errorf("more than %d keys", max)
		}
		k, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out[k.(string)] = v
	}
	return out, nil
}

// runJob makes a chat or generate request a normalized run, written in
// Ollama's NDJSON (or one object, not streamed). A call without messages
// or prompt is Ollama's "load the model": nothing runs, and it is answered
// once the model is one a request could be scheduled for now; a model that
// only a sleeping machine served is woken first (Turn.Await, issue 23), so
// `ollama run` waits on its spinner as it would for a load.
func runJob(t *frontend.Turn, route string) (frontend.Job, *frontend.Failure) {
	pr, f := parseRun(route, t.Body)
	if f != nil {
		return nil, f
	}
	out := newNDJSON(t, pr.stream, route == routeGenerate)
	if pr.load {
		return frontend.Answer(func(*frontend.Response) *frontend.Failure {
			if f := t.Await(); f != nil {
				return f
			}
			if !out.done("load", nil) {
				return frontend.FailClientGone
			}
			return nil
		}), nil
	}
	return &frontend.RunJob{Run: pr.run, Out: out}, nil
}
