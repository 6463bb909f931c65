package ollama

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/iop-dev/iop/sdk"
)

// Forced tool calls. Ollama has no tool_choice: a model given tools calls
// one or not, as it likes. A run whose choice forces a call (a named
// function, or required) is sent instead with format set to a JSON schema
// of the call, which Ollama enforces with a grammar, and the answer's JSON
// text comes back as that call:
//
//   - a named function, or required with one tool: format is the tool's
//     parameters schema, and the answer is the call's arguments;
//   - required over several tools: format is a oneOf of one object per
//     tool, {"name": <the tool's name, as a const>, "parameters": <its
//     parameters schema>}, both required, nothing else allowed, and the
//     answer names the tool and holds its arguments.
//
// The union is a oneOf of whole calls, not {"name": enum, "arguments":
// anyOf}, so that the grammar ties each tool's arguments to its name: once
// the model has written a name, only that tool's arguments can follow.
// The keys are "name" then "parameters" because the grammar writes
// properties in their order and Ollama's newer engine re-encodes the
// schema with its keys sorted: in both orders the model chooses the tool
// before writing its arguments. {"name", "parameters"} is also the shape
// that Llama 3's and many small models' tool calls take.
//
// The tools are not sent with the constrained request, and the
// conversation is sent as it is, with its earlier calls and results. With
// tools beside a schema, the answer is no longer forced: llama.cpp, which
// newer Ollama runs many models on, then lets the model choose between a
// call of any tool and the schema's answer (its generic handler's anyOf),
// and Ollama's own tool parser may read the answer as a call of another
// tool. The schema alone is enforced on every engine. (A server that
// answers with a tool call anyway has that call relayed as it came, and
// the answer's text with it.)
//
// The answer is not streamed as text: its pieces are kept (up to
// MaxLineBytes) and the call is sent whole, with an id of its own, once
// the answer is done; the run ends with "tool_calls". Thinking still
// streams as it comes. An answer that is not the JSON the schema asked for
// (a model or server that ignored format, or an answer cut short by the
// token limit) fails the run with ErrForcedCall, as KindUpstream: it is
// never passed off as text, which a client that forced a call would not
// expect. The run's own Format is not sent: the answer is a call, not
// text, and OpenAI's API, too, applies response_format to text only.

// ErrForcedCall is the cause (errors.Is, in the adapter's process) of a run
// whose forced tool call the model did not answer with the JSON asked for.
var ErrForcedCall = errors.New("the model's answer is not the forced tool call's JSON")

// forcedCall is a tool call that a run must make.
type forcedCall struct {
	choice sdk.ToolChoice
	// name is the one tool called, or "" when the model chooses among
	// names.
	name   string
	names  []string
	schema json.RawMessage // sent as format
}

// unionCall is one branch of the schema of a call among several tools.
// Its fields are in the order the model writes them.
type unionCall struct {
	Type       string `json:"type"`
	Properties struct {
		Name struct {
			Const string `json:"const"`
		} `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"properties"`
	Required             []string `json:"required"`
	AdditionalProperties bool     `json:"additionalProperties"`
}

// forceCall returns the call that choice c forces among tools (c has
// passed Check and Forces).
func forceCall(c sdk.ToolChoice, tools []sdk.Tool) (*forcedCall, error) {
	name, named := c.Function()
	if !named && len(tools) == 1 {
		name, named = tools[0].Name, true
	}
	if named {
		i := slices.IndexFunc(tools, func(t sdk.Tool) bool { return t.Name == name })
		schema, err := parameters(i, tools[i])
		if err != nil {
			return nil, err
		}
		return &forcedCall{choice: c, name: name, schema: schema}, nil
	}
	f := &forcedCall{choice: c}
	branches := make([]unionCall, len(tools))
	for i, t := range tools {
		schema, err := parameters(i, t)
		if err != nil {
			return nil, err
		}
		b := &branches[i]
		b.Type, b.Required = "object", []string{"name", "parameters"}
		b.Properties.Name.Const, b.Properties.Parameters = t.Name, schema
		f.names = append(f.names, t.Name)
	}
	schema, err := json.Marshal(map[string]any{"oneOf": branches})
	if err != nil {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "ollama: encode the forced tool call's schema: %w", err)
	}
	f.schema = schema
	return f, nil
}

// parameters returns tool t's (the i-th) parameters schema, or an empty
// object's when it has none.
func parameters(i int, t sdk.Tool) (json.RawMessage, error) {
	p := bytes.TrimSpace(t.Parameters)
	switch {
	case len(p) == 0 || string(p) == "null":
		return emptySchema, nil
	case !json.Valid(p):
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "ollama: tools[%d] (%s): parameters are not valid JSON", i, t.Name)
	}
	return p, nil
}

// call reads the answer's text as the forced call, the n-th of the run.
// doneReason is Ollama's, to say why an answer is incomplete.
func (f *forcedCall) call(n int, text, doneReason string) (*sdk.ToolCall, error) {
	name, args := f.name, []byte(strings.TrimSpace(text))
	if len(args) == 0 {
		return nil, f.malformed("JSON", doneReason)
	}
	if name == "" {
		var call struct {
			Name       string          `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
			Arguments  json.RawMessage `json:"arguments"` // the other common spelling
		}
		if err := json.Unmarshal(args, &call); err != nil || !slices.Contains(f.names, call.Name) {
			return nil, f.malformed("an object naming one of the run's tools", doneReason)
		}
		name, args = call.Name, call.Parameters
		if isNull(args) {
			args = call.Arguments
		}
		if isNull(args) {
			args = []byte("{}")
		}
	}
	compact, err := objectJSON(string(args))
	if err != nil {
		return nil, f.malformed("a JSON object of the tool's arguments", doneReason)
	}
	return &sdk.ToolCall{Index: n, ID: "call_" + rand.Text(), Name: name, Arguments: string(compact)}, nil
}

// malformed is the failure of an answer that is not what the schema asked
// for (want). It names the choice, never the answer's text.
func (f *forcedCall) malformed(want, doneReason string) error {
	why := "the model or server did not follow the schema sent as format"
	if doneReason == "length" {
		why = "the answer was cut short by the token limit"
	}
	return &sdk.Error{Kind: sdk.KindUpstream, Err: ErrForcedCall,
		Message: fmt.Sprintf("ollama chat: tool_choice %q: the answer is not %s (%s)", f.choice, want, why)}
}
