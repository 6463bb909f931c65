package fakemodel

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Defaults of an Agent.
var (
	// DefaultAgentTools are the shell tools of the agents the project
	// tests: Claude Code's Bash, Codex's shell, exec_command and
	// shell_command.
	DefaultAgentTools = []string{"Bash", "shell", "exec_command", "shell_command"}
	// DefaultAgentShell is the argv before the command when a command
	// parameter takes an array, as Codex's shell tool does.
	DefaultAgentShell = []string{"bash", "-lc"}
)

// Default strings of an Agent.
const (
	DefaultAgentCommand = "echo iop-agent-ok"
	DefaultAgentReply   = "The command printed: "
)

// maxQuote bounds the part of a tool's result an agent's reply quotes.
const maxQuote = 400

// Agent makes a fake model answer as a coding agent's model does, so that
// a real agent (Claude Code, Codex) completes a session of turns with tool
// calls against it:
//
//   - A turn that asks (its last messages are the user's, with no tool
//     result since the model last spoke) and offers tools is answered with
//     one call, to the first of Tools the request offers (else to the
//     first tool offered), with arguments that fit the tool's parameters
//     schema: Command in a "command" or "cmd" parameter (Shell and Command
//     for an array of strings), the other required parameters filled with
//     valid values (see Generate).
//   - A turn that carries a tool's result is answered with text that
//     quotes it: Reply, then the result on one line (cut at 400 bytes).
//   - A turn without tools offered is answered as the model answers
//     without an agent.
//
// A forced tool choice (a named function, or "required") is a call even
// after a tool result; "none" offers no tools. The zero value takes every
// default.
type Agent struct {
	// Tools names the tools the model prefers, in order (default
	// DefaultAgentTools). A name matches a tool of that name, or one whose
	// name ends in it after a '.', '/', ':' or "__" (a namespaced tool
	// flattened into a function).
	Tools []string `json:"tools,omitempty"`
	// Command is the shell command it runs (default DefaultAgentCommand).
	Command string `json:"command,omitempty"`
	// Shell is the argv before Command for an array parameter (default
	// DefaultAgentShell).
	Shell []string `json:"shell,omitempty"`
	// Reply starts the answer to a tool's result (default
	// DefaultAgentReply).
	Reply string `json:"reply,omitempty"`
}

// Tool is a tool a request offers: its name and JSON schema of parameters
// (absent: an object of any properties).
type Tool struct {
	Name       string
	Parameters json.RawMessage
}

// Choice is a request's tool choice, as the agent honours it.
type Choice struct {
	// None offers no tools ("none").
	None bool
	// Required forces a call to some tool ("required", Anthropic's "any").
	Required bool
	// Name forces a call to the named tool.
	Name string
}

// Turn is what the agent reads of a request.
type Turn struct {
	Tools  []Tool
	Choice Choice
	// Result is the content of the tool result the conversation ends with:
	// the last tool message after the model's last message, nil when there
	// is none. Agents may append a user message after a result (Claude Code
	// adds reminders to the turn that carries it); the turn still carries
	// the result, and answering it with another call would never end.
	Result *string
}

// Call is a tool call the agent makes.
type Call struct {
	Name string
	// Arguments is a compact JSON object.
	Arguments json.RawMessage
}

// Decision is the agent's answer to a turn: a call, a text, or neither
// (the model answers as it would without an agent).
type Decision struct {
	Call *Call
	Text string
}

// ErrForcedTool is the error of a forced tool choice naming a tool the
// request does not offer.
var ErrForcedTool = errors.New("fakemodel: forced tool not offered")

// Decide answers a turn. words fill the string parameters a call needs
// besides the command.
func (a Agent) Decide(t Turn, words []string) (Decision, error) {
	tools := t.Tools
	if t.Choice.None {
		tools = nil
	}
	var pick *Tool
	switch {
	case t.Choice.Name != "" && !t.Choice.None:
		for i := range tools {
			if tools[i].Name == t.Choice.Name {
				pick = &tools[i]
			}
		}
		if pick == nil {
			return Decision{}, fmt.Errorf("%w: %q", ErrForcedTool, t.Choice.Name)
		}
	case t.Result != nil && !t.Choice.Required:
		return Decision{Text: a.quote(*t.Result)}, nil
	case len(tools) > 0:
		pick = a.choose(tools)
	default:
		return Decision{}, nil
	}
	args, err := a.Arguments(*pick, words)
	if err != nil {
		return Decision{}, err
	}
	return Decision{Call: &Call{Name: pick.Name, Arguments: args}}, nil
}

// choose returns the first preferred tool offered, else the first offered.
func (a Agent) choose(tools []Tool) *Tool {
	prefs := a.Tools
	if len(prefs) == 0 {
		prefs = DefaultAgentTools
	}
	for _, p := range prefs {
		for i := range tools {
			if nameMatches(tools[i].Name, p) {
				return &tools[i]
			}
		}
	}
	return &tools[0]
}

func nameMatches(name, pref string) bool {
	if name == pref {
		return true
	}
	for _, sep := range []string{".", "/", ":", "__"} {
		if strings.HasSuffix(name, sep+pref) {
			return true
		}
	}
	return false
}

// Arguments builds the arguments of a call to t: the command where the
// schema has a command parameter, valid values for the other required
// ones, as a compact JSON object.
func (a Agent) Arguments(t Tool, words []string) (json.RawMessage, error) {
	schema := t.Parameters
	if len(schema) == 0 || string(schema) == "null" {
		schema = json.RawMessage(`{"type":"object"}`)
	}
	v, err := Generate(schema, a.Fill(words))
	if err != nil {
		return nil, fmt.Errorf("tool %q: %w", t.Name, err)
	}
	args := v.Compact()
	if len(args) == 0 || args[0] != '{' {
		return nil, fmt.Errorf("tool %q: %w: parameters are not an object", t.Name, ErrSchema)
	}
	return args, nil
}

// Fill is how the agent fills a schema: required parameters only, its
// command in a command parameter, strings drawn from words.
func (a Agent) Fill(words []string) Fill {
	return Fill{Words: words, Command: a.command(), Shell: a.shell()}
}

func (a Agent) command() string {
	if a.Command != "" {
		return a.Command
	}
	return DefaultAgentCommand
}

func (a Agent) shell() []string {
	if a.Shell != nil {
		return a.Shell
	}
	return DefaultAgentShell
}

// quote is the answer to a tool's result: Reply and the result's text on
// one line, cut at maxQuote bytes.
func (a Agent) quote(result string) string {
	reply := a.Reply
	if reply == "" {
		reply = DefaultAgentReply
	}
	text := strings.Join(strings.Fields(result), " ")
	if len(text) > maxQuote {
		cut := maxQuote
		for cut > 0 && !utf8.RuneStart(text[cut]) {
			cut--
		}
		text = text[:cut] + "…"
	}
	if text == "" {
		text = "(nothing)"
	}
	return reply + text
}

// CallID returns a tool call id made from the parts (a model, the prompt):
// the same request gets the same id, every turn of a session a new one, as
// agents need (Anthropic's API refuses a conversation whose tool_use ids
// repeat).
func CallID(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return "call_" + hex.EncodeToString(h.Sum(nil))[:24]
}
