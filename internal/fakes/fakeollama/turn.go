package fakeollama

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/iop-dev/iop/internal/fakes/fakemodel"
)

// Agent makes a model answer as a coding agent's model does: one tool call
// for a turn that asks, a quote of the tool's result after it (see
// fakemodel.Agent).
type Agent = fakemodel.Agent

// thinkValue is a request's think, read as Ollama's api.ThinkValue reads
// it.
type thinkValue struct {
	set   bool   // the request has one
	on    bool   // true, or any level
	level string // "low", "medium", "high", "max"; "" for a bool
}

// thinkLevels are the levels Ollama takes ("max" since 0.17.7; it maps it
// to "high" for models that take levels).
var thinkLevels = []string{"high", "medium", "low", "max"}

// parseThink reads think as Ollama decodes it: a bool or one of its
// levels; anything else is refused with Ollama's message (a 400, as every
// body Ollama cannot bind).
func parseThink(raw json.RawMessage) (thinkValue, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return thinkValue{}, nil
	}
	var b bool
	if json.Unmarshal(raw, &b) == nil {
		return thinkValue{set: true, on: b}, nil
	}
	var level string
	if json.Unmarshal(raw, &level) == nil {
		for _, l := range thinkLevels {
			if level == l {
				return thinkValue{set: true, on: true, level: level}, nil
			}
		}
		return thinkValue{}, fmt.Errorf(`invalid think value: %q (must be "high", "medium", "low", "max", true, or false)`, level)
	}
	return thinkValue{}, errors.New(`think must be a boolean or string ("high", "medium", "low", "max", true, or false)`)
}

// String is the think value as recorded: a level, "true", "false", or ""
// when the request had none.
func (t thinkValue) String() string {
	switch {
	case t.level != "":
		return t.level
	case t.set:
		return fmt.Sprint(t.on)
	}
	return ""
}

// refusesLevel reports whether m answers t with Ollama 0.17.4–0.17.6's
// 400 for a level on a model whose template takes none.
func (m Model) refusesLevel(t thinkValue) bool {
	return t.level != "" && m.RefuseThinkLevels && !m.ThinkLevels
}

// thinking is the thinking m streams for t. A model that takes levels
// thinks whatever the bool says (as Ollama documents for gpt-oss), a third
// of its thinking at low, two thirds at medium (also for a bool), all at
// high or max; any other model thinks unless told false, a level meaning
// true (as Ollama renders it for a template without levels).
func (m Model) thinking(t thinkValue) []string {
	toks := m.ThinkingTokens()
	switch {
	case len(toks) == 0:
		return nil
	case m.ThinkLevels:
		share := 2.0 / 3
		switch t.level {
		case "low":
			share = 1.0 / 3
		case "high", "max":
			share = 1
		}
		return toks[:int(math.Ceil(share*float64(len(toks))))]
	case t.set && !t.on:
		return nil
	}
	return toks
}

// format is a request's format as Ollama's runner reads it.
type format struct {
	json   bool            // "json": some JSON object
	schema json.RawMessage // a JSON schema object
}

// parseFormat reads format: absent, null and "" are none, "json" any JSON
// object, an object a JSON schema; anything else fails with Ollama's
// message (a 500: the runner refuses it).
func parseFormat(raw json.RawMessage) (format, error) {
	switch string(raw) {
	case "", "null", `""`:
		return format{}, nil
	case `"json"`:
		return format{json: true}, nil
	}
	var obj map[string]json.RawMessage
	if raw[0] != '{' || json.Unmarshal(raw, &obj) != nil {
		return format{}, fmt.Errorf("invalid format: %q; expected \"json\" or a valid JSON Schema object", []byte(raw))
	}
	return format{schema: raw}, nil
}

func (f format) none() bool { return !f.json && f.schema == nil }

// errSchemaFormat is Ollama's error for a schema it cannot turn into a
// grammar.
var errSchemaFormat = errors.New("invalid JSON schema in format")

// structured is m's answer under format f, as the tokens of JSON written
// as a model writes it: for a schema, a value that conforms to it (its
// strings drawn from m's answer); for "json", m's Text when that is a JSON
// object, else {"answer": <m's answer>}.
func (m Model) structured(f format) ([]string, error) {
	if f.schema != nil {
		words := strings.Fields(m.AnswerText())
		fill := fakemodel.Fill{Words: words, Optional: true}
		if m.Agent != nil {
			// A forced tool call constrained by format: the agent's command
			// goes where a shell tool's schema wants one.
			agent := m.Agent.Fill(words)
			fill.Command, fill.Shell = agent.Command, agent.Shell
		}
		v, err := fakemodel.Generate(f.schema, fill)
		if err != nil {
			// Ollama says no more than this; neither does the fake, so that
			// an adapter sees the real message.
			return nil, errSchemaFormat
		}
		return splitTokens(v.Spaced()), nil
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal([]byte(m.Text), &obj) == nil {
		return splitTokens(m.Text), nil
	}
	answer, _ := json.Marshal(m.AnswerText())
	return splitTokens(`{"answer": ` + string(answer) + `}`), nil
}

// reply is what a model answers one request, as the tokens it streams.
type reply struct {
	thinking, content []string
	calls             []WireCall
}

// chatReply is m's answer to req: its thinking, then JSON under a format
// (which constrains the whole answer: no tool calls), else the agent's
// call or quote, else its own answer and, when the request offers tools,
// its ToolCalls. callID names the agent's call.
func (m Model) chatReply(req ChatRequest, t thinkValue, f format, callID string) (reply, error) {
	r := reply{thinking: m.thinking(t)}
	if !f.none() {
		var err error
		r.content, err = m.structured(f)
		return r, err
	}
	if m.Agent != nil {
		d, err := m.Agent.Decide(agentTurn(req), strings.Fields(m.AnswerText()))
		if err != nil {
			return r, fmt.Errorf("fakeollama: agent: %w", err)
		}
		switch {
		case d.Call != nil:
			call := WireCall{Function: WireFunction{Name: d.Call.Name, Arguments: d.Call.Arguments}}
			if !m.OmitToolCallIDs {
				call.ID = callID
			}
			r.calls = []WireCall{call}
			return r, nil
		case d.Text != "":
			r.content = splitTokens(d.Text)
			return r, nil
		}
	}
	r.content = m.Answer()
	if len(req.Tools) > 0 {
		r.calls = m.wireCalls()
	}
	return r, nil
}

// generateReply is m's answer to a generate: thinking, then JSON under a
// format, else its answer.
func (m Model) generateReply(t thinkValue, f format) (reply, error) {
	r := reply{thinking: m.thinking(t)}
	if !f.none() {
		var err error
		r.content, err = m.structured(f)
		return r, err
	}
	r.content = m.Answer()
	return r, nil
}

// wireCalls are m's ToolCalls as Ollama writes them.
func (m Model) wireCalls() []WireCall {
	calls := make([]WireCall, len(m.ToolCalls))
	for i, tc := range m.ToolCalls {
		args := tc.Arguments
		if len(args) == 0 {
			args = json.RawMessage("{}")
		}
		calls[i] = WireCall{Function: WireFunction{Index: i, Name: tc.Name, Arguments: args}}
		if !m.OmitToolCallIDs {
			calls[i].ID = fmt.Sprintf("call_%s%02d", m.digest()[:6], i)
		}
	}
	return calls
}

// agentTurn reads what the agent needs of a chat request: its tools, and
// the tool result since the model last spoke (the last one, when several).
func agentTurn(req ChatRequest) fakemodel.Turn {
	var t fakemodel.Turn
	for _, tool := range req.Tools {
		t.Tools = append(t.Tools, fakemodel.Tool{Name: tool.Function.Name, Parameters: tool.Function.Parameters})
	}
	for i := len(req.Messages) - 1; i >= 0 && req.Messages[i].Role != "assistant"; i-- {
		if req.Messages[i].Role == "tool" {
			content := req.Messages[i].Content
			t.Result = &content
			break
		}
	}
	return t
}

// chatTokens is a chat prompt as the prompt cache sees it: every message
// framed by the four special tokens of a chat template (start, role,
// message, end), which the prompt's count includes as well.
func chatTokens(msgs []Message) fakemodel.Tokens {
	var t fakemodel.Tokens
	for _, m := range msgs {
		t = t.AppendSpecial("<|start|>").AppendSpecial(m.Role).AppendSpecial("<|message|>").
			AppendText(m.Content).AppendSpecial("<|end|>")
	}
	return t
}
