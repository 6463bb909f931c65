package fakeopenai

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/iop-dev/iop/internal/fakes/fakemodel"
)

// respond returns m as it answers req: the agent's call or quote in place
// of its configured answer, else JSON that fits the response_format, else
// m itself. An agent's call wins over a response_format, which shapes the
// text of an answer, not whether the model calls a tool.
func (m Model) respond(req chatRequest) (Model, error) {
	words := strings.Fields(strings.Join(m.tokens(), ""))
	if m.Agent != nil {
		d, err := m.Agent.Decide(agentTurn(req), words)
		switch {
		case errors.Is(err, fakemodel.ErrForcedTool) && len(req.Tools) == 0:
			return m, requestError("When using `tool_choice`, `tools` must be set.")
		case errors.Is(err, fakemodel.ErrForcedTool):
			return m, requestError(fmt.Sprintf("Tool '%s' has not been passed in `tools`.", toolChoice(req.ToolChoice).Name))
		case err != nil:
			return m, err
		case d.Call != nil:
			m.Tokens = []string{} // a call alone, after any reasoning
			m.ToolCalls = []ToolCall{{ID: fakemodel.CallID(m.Name, promptKey(req)), Name: d.Call.Name, Arguments: string(d.Call.Arguments)}}
			m.FinishReason = ""
			return m, nil
		case d.Text != "":
			m.Tokens, m.ToolCalls = fakemodel.Pieces(d.Text), nil
			m.FinishReason = ""
			return m, nil
		}
		m.ToolCalls = nil // the agent's own answer without tools: no calls
	}
	return m.structured(req.ResponseFormat, words)
}

// structured answers a response_format: json_schema with JSON that fits
// the schema, json_object with m's text when that is a JSON object (else
// {"answer": <its text>}); text, or none, with m as it is.
func (m Model) structured(raw json.RawMessage, words []string) (Model, error) {
	var rf struct {
		Type       string `json:"type"`
		JSONSchema struct {
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	}
	if len(raw) == 0 || string(raw) == "null" || json.Unmarshal(raw, &rf) != nil {
		return m, nil
	}
	var text string
	switch rf.Type {
	case "json_schema":
		schema := rf.JSONSchema.Schema
		if len(schema) == 0 {
			schema = json.RawMessage(`{"type":"object"}`)
		}
		v, err := fakemodel.Generate(schema, fakemodel.Fill{Words: words, Optional: true})
		if err != nil {
			return m, requestError("response_format.json_schema: " + err.Error())
		}
		text = v.Spaced()
	case "json_object":
		own := strings.Join(m.tokens(), "")
		var obj map[string]json.RawMessage
		if json.Unmarshal([]byte(own), &obj) == nil {
			text = own
		} else {
			answer, _ := json.Marshal(own)
			text = `{"answer": ` + string(answer) + `}`
		}
	default:
		return m, nil
	}
	m.Tokens = fakemodel.Pieces(text)
	return m, nil
}

// agentTurn reads what the agent needs of a chat request: its function
// tools, its tool_choice, and the tool result since the model last spoke.
func agentTurn(req chatRequest) fakemodel.Turn {
	var t fakemodel.Turn
	for _, tool := range req.Tools {
		if tool.Type == "function" || tool.Type == "" {
			t.Tools = append(t.Tools, fakemodel.Tool{Name: tool.Function.Name, Parameters: tool.Function.Parameters})
		}
	}
	t.Choice = toolChoice(req.ToolChoice)
	for i := len(req.Messages) - 1; i >= 0 && req.Messages[i].Role != "assistant"; i-- {
		if req.Messages[i].Role == "tool" {
			content := messageText(req.Messages[i].Content)
			t.Result = &content
			break
		}
	}
	return t
}

// toolChoice reads tool_choice: "none", "required", a named function;
// "auto", absent, and kinds the fake does not act on (allowed_tools) leave
// the choice to the model.
func toolChoice(raw json.RawMessage) fakemodel.Choice {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return fakemodel.Choice{None: s == "none", Required: s == "required"}
	}
	var named struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &named) == nil {
		return fakemodel.Choice{Name: named.Function.Name}
	}
	return fakemodel.Choice{}
}

// requestError is a request the fake refuses with 400, in the words of
// the server it follows (vLLM's, for tool_choice).
type requestError string

func (e requestError) Error() string { return string(e) }

// messageText is a message's text: its string content, or the text of its
// content parts, one per line.
func messageText(content json.RawMessage) string {
	var text string
	if json.Unmarshal(content, &text) == nil {
		return text
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(content, &parts) != nil {
		return ""
	}
	texts := make([]string, len(parts))
	for i, p := range parts {
		texts[i] = p.Text
	}
	return strings.Join(texts, "\n")
}

// promptKey is what makes a call id differ per turn: the messages' count
// and text.
func promptKey(req chatRequest) string {
	var b strings.Builder
	fmt.Fprint(&b, len(req.Messages))
	for _, msg := range req.Messages {
		b.WriteString(msg.Role)
		b.Write(msg.Content)
	}
	return b.String()
}
