package ollama

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/iop-dev/iop/sdk"
)

// Ollama's /api/chat wire shapes (docs/api.md, api/types.go), as far as the
// adapter uses them.

type chatRequest struct {
	Model     string          `json:"model"`
	Messages  []message       `json:"messages"`
	Stream    bool            `json:"stream"`
	Format    json.RawMessage `json:"format,omitempty"`
	KeepAlive json.RawMessage `json:"keep_alive,omitempty"`
	Tools     []tool          `json:"tools,omitempty"`
	Options   map[string]any  `json:"options,omitempty"`
	// Think is true or false, or a level ("high") from Extra.
	Think    json.RawMessage `json:"think,omitempty"`
	Truncate json.RawMessage `json:"truncate,omitempty"`
	Shift    json.RawMessage `json:"shift,omitempty"`
}

type message struct {
	Role      string     `json:"role"`
	Content   string     `json:"content"`
	Thinking  string     `json:"thinking,omitempty"`
	Images    [][]byte   `json:"images,omitempty"` // base64 on the wire
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
	// ToolName names the tool whose result a "tool" message carries.
	ToolName   string `json:"tool_name,omitempty"`
	ToolCallID string `json:"tool_call_id,omitempty"`
}

// toolCall's arguments are a JSON object on the wire, not a string.
type toolCall struct {
	ID       string       `json:"id,omitempty"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Index     int             `json:"index"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

type tool struct {
	Type     string   `json:"type"`
	Function toolSpec `json:"function"`
}

type toolSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

// chatLine is one NDJSON line of a streamed /api/chat or /api/generate
// answer: a piece of the message (chat) or of the response (generate), the
// final done line (with counts and durations in nanoseconds), or
// {"error": ...}.
type chatLine struct {
	Message struct {
		Content   string     `json:"content"`
		Thinking  string     `json:"thinking"`
		ToolCalls []toolCall `json:"tool_calls"`
	} `json:"message"`
	// Response and Thinking are /api/generate's pieces.
	Response           string `json:"response"`
	Thinking           string `json:"thinking"`
	Done               bool   `json:"done"`
	DoneReason         string `json:"done_reason"`
	TotalDuration      int64  `json:"total_duration"`
	LoadDuration       int64  `json:"load_duration"`
	PromptEvalCount    int64  `json:"prompt_eval_count"`
	PromptEvalDuration int64  `json:"prompt_eval_duration"`
	EvalCount          int64  `json:"eval_count"`
	EvalDuration       int64  `json:"eval_duration"`
	Error              string `json:"error"`
}

func (l *chatLine) usage() *sdk.Usage {
	return &sdk.Usage{
		PromptTokens:       l.PromptEvalCount,
		CompletionTokens:   l.EvalCount,
		TotalDuration:      time.Duration(l.TotalDuration),
		LoadDuration:       time.Duration(l.LoadDuration),
		PromptEvalDuration: time.Duration(l.PromptEvalDuration),
		EvalDuration:       time.Duration(l.EvalDuration),
	}
}

var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// chat is a run's /api/chat request, and what the adapter must know to
// read its answer.
type chat struct {
	req  *chatRequest
	rest map[string]json.RawMessage // Extra's fields sent at the top level
	// forced is the tool call the run must make, or nil.
	forced *forcedCall
	// relaxThink: think came from the normalized options and asks for
	// thinking (see relaxedThink).
	relaxThink bool
}

// encode is the request's JSON body.
func (c *chat) encode() ([]byte, error) {
	b, err := encodeWith(c.req, c.rest)
	if err != nil {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "ollama: encode chat request: %w", err)
	}
	return b, nil
}

// buildChat turns a normalized run into Ollama's chat request (options and
// tool choice: see options.go; forced tool calls: forced.go; system turns:
// systemturns.go). Errors are KindInvalidRequest and name the field (of the
// run's message), never its content.
func buildChat(req *sdk.Request, s *settings) (*chat, error) {
	if req.Target == "" {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "ollama: the run has no target model")
	}
	cr := &chatRequest{Model: req.Target, Stream: true}
	callNames := map[string]string{} // tool call id → tool name, for tool results
	sent, from := s.systemTurns.apply(req.Messages)
	for i, m := range sent {
		wm := message{Role: m.Role, Content: m.Content, Thinking: m.Reasoning, Images: m.Images}
		for j, tc := range m.ToolCalls {
			args, err := objectJSON(tc.Arguments)
			if err != nil {
				return nil, sdk.Errorf(sdk.KindInvalidRequest, "ollama: messages[%d].tool_calls[%d].arguments: %v", from[i], j, err)
			}
			wm.ToolCalls = append(wm.ToolCalls, toolCall{ID: tc.ID, Function: toolFunction{Index: j, Name: tc.Name, Arguments: args}})
			if tc.ID != "" {
				callNames[tc.ID] = tc.Name
			}
		}
		if m.Role == "tool" {
			wm.ToolCallID = m.ToolCallID
			wm.ToolName = m.Name
			if wm.ToolName == "" {
				wm.ToolName = callNames[m.ToolCallID]
			}
		}
		cr.Messages = append(cr.Messages, wm)
	}
	tools, forced, err := toolsFor(req)
	if err != nil {
		return nil, err
	}
	for i, t := range tools {
		params, err := parameters(i, t)
		if err != nil {
			return nil, err
		}
		cr.Tools = append(cr.Tools, tool{Type: "function", Function: toolSpec{Name: t.Name, Description: t.Description, Parameters: params}})
	}
	var top topLevel
	if cr.Options, top, err = options(req.Options); err != nil {
		return nil, err
	}
	cr.Think, cr.Truncate, cr.Shift, cr.KeepAlive = top.think, top.truncate, top.shift, top.keepAlive
	if s.keepAlive != nil {
		cr.KeepAlive = s.keepAlive
	}
	if cr.Format, err = format(req.Options.Format); err != nil {
		return nil, err
	}
	if forced != nil {
		cr.Format = forced.schema // the answer is the call (forced.go)
	}
	return &chat{req: cr, rest: top.rest, forced: forced, relaxThink: top.relaxThink}, nil
}

// format passes "json" or a JSON schema through; a bare json (not a JSON
// string) is accepted as "json".
func format(f json.RawMessage) (json.RawMessage, error) {
	f = bytes.TrimSpace(f)
	switch {
	case len(f) == 0 || string(f) == "null" || string(f) == `""`:
		return nil, nil
	case string(f) == "json":
		return json.RawMessage(`"json"`), nil
	case json.Valid(f):
		return f, nil
	}
	return nil, sdk.Errorf(sdk.KindInvalidRequest, `ollama: options.format must be "json" or a JSON schema`)
}

// objectJSON checks that s is a JSON object ("" means {}) and compacts it.
func objectJSON(s string) (json.RawMessage, error) {
	if len(bytes.TrimSpace([]byte(s))) == 0 {
		return json.RawMessage("{}"), nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(s)); err != nil {
		return nil, fmt.Errorf("not valid JSON")
	}
	if buf.Len() == 0 || buf.Bytes()[0] != '{' {
		return nil, fmt.Errorf("not a JSON object")
	}
	return buf.Bytes(), nil
}
