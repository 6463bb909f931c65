package openaiapi

import (
	"encoding/json"
	"strconv"
	"strings"
)

// Built-in tools of the Responses API that the client runs itself
// (OpenAI's model only asks for them): local_shell (Codex's older shell),
// shell with a local environment, and apply_patch. The Edge offers each as
// a function whose parameters are the fields of the call's action (or
// operation), and writes the model's call back as the built-in's own item:
//
//	local_shell   local_shell(command, working_directory, timeout_ms, env)
//	              → local_shell_call {action: {type: exec, ...}}
//	shell         shell(commands, timeout_ms, max_output_length)
//	              → shell_call {action, environment: {type: local}}
//	apply_patch   apply_patch(type, path, diff)
//	              → apply_patch_call {operation}
//
// Their calls and outputs in input become the conversation's tool calls
// and tool answers the same way back. A shell tool whose environment is a
// container runs at OpenAI: it is a hosted tool (hostedToolTypes).

// builtinTool is a client-executed built-in tool.
type builtinTool struct {
	typ    string // the tool's type, and the function's preferred name
	call   string // the type of its call item
	output string // the type of its output item
	// field is the call item's field that holds the arguments: "action"
	// or "operation".
	field string
	// actionType, if not "", is the "type" of its action, which the
	// function's arguments leave out (local_shell's "exec").
	actionType  string
	description string
	parameters  json.RawMessage
	// defaults are fields the call item's action always has, for those
	// the model left out ({"command":[]}): clients read them as required.
	defaults map[string]json.RawMessage
	// environment, if not "", is the call item's environment type.
	environment string
}

var builtinTools = map[string]*builtinTool{
	"local_shell": {
		typ: "local_shell", call: "local_shell_call", output: "local_shell_call_output", field: "action", actionType: "exec",
		description: "Runs a command on the user's machine and returns its output. command is the program and its arguments, " +
			`one string each (for a shell command line: ["bash", "-lc", "..."]).`,
		parameters: json.RawMessage(`{"type":"object","properties":{` +
			`"command":{"type":"array","items":{"type":"string"},"description":"The program and its arguments."},` +
			`"working_directory":{"type":"string","description":"The directory to run it in."},` +
			`"timeout_ms":{"type":"integer","description":"How long it may run, in milliseconds."},` +
			`"env":{"type":"object","additionalProperties":{"type":"string"},"description":"Environment variables to set."}},` +
			`"required":["command"]}`),
		defaults: map[string]json.RawMessage{"command": json.RawMessage("[]"), "env": json.RawMessage("{}")},
	},
	"shell": {
		typ: "shell", call: "shell_call", output: "shell_call_output", field: "action", environment: "local",
		description: "Runs shell commands on the user's machine, one after another, and returns the output and exit status of each.",
		parameters: json.RawMessage(`{"type":"object","properties":{` +
			`"commands":{"type":"array","items":{"type":"string"},"description":"Shell command lines, run in order."},` +
			`"timeout_ms":{"type":"integer","description":"How long each may run, in milliseconds."},` +
			`"max_output_length":{"type":"integer","description":"The most characters of output to return of each."}},` +
			`"required":["commands"]}`),
		defaults: map[string]json.RawMessage{"commands": json.RawMessage("[]")},
	},
	"apply_patch": {
		typ: "apply_patch", call: "apply_patch_call", output: "apply_patch_call_output", field: "operation",
		description: "Creates, updates or deletes a file on the user's machine. type create_file: diff is the new file's " +
			"content, each line prefixed with +; update_file: diff is a diff of the change, in hunks starting with @@; " +
			"delete_file: no diff.",
		parameters: json.RawMessage(`{"type":"object","properties":{` +
			`"type":{"type":"string","enum":["create_file","update_file","delete_file"]},` +
			`"path":{"type":"string","description":"The file's path."},` +
			`"diff":{"type":"string"}},"required":["type","path"]}`),
		defaults: map[string]json.RawMessage{"type": json.RawMessage(`""`), "path": json.RawMessage(`""`)},
	},
}

// builtinCalls are the built-ins by the type of their call items.
var builtinCalls = func() map[string]*builtinTool {
	m := map[string]*builtinTool{}
	for _, b := range builtinTools {
		m[b.call] = b
	}
	return m
}()

// action is the action (or operation) of a call item whose function was
// called with args: the arguments' fields, with the action's type and the
// fields clients require. Arguments that are not a JSON object (a model
// that wrote something else) give an action of the defaults alone, which
// the client reports back as a failed call: the model sees why.
func (b *builtinTool) action(args []byte) json.RawMessage {
	fields := map[string]json.RawMessage{}
	if len(args) > 0 && json.Unmarshal(args, &fields) != nil {
		fields = map[string]json.RawMessage{}
	}
	for k, v := range b.defaults {
		if !given(fields[k]) {
			fields[k] = v
		}
	}
	if b.actionType != "" {
		fields["type"] = json.RawMessage(strconv.Quote(b.actionType))
	}
	out, err := json.Marshal(fields)
	if err != nil { // a value json.Unmarshal took that json.Marshal refuses: none
		return json.RawMessage("{}")
	}
	return out
}

// arguments are the function's arguments of a call item's action, for a
// history: the action's fields without its type (local_shell's "exec").
func (b *builtinTool) arguments(action json.RawMessage) ([]byte, bool) {
	if !given(action) {
		return []byte("{}"), true
	}
	fields := map[string]json.RawMessage{}
	if err := json.Unmarshal(action, &fields); err != nil {
		return nil, false
	}
	if b.actionType != "" {
		delete(fields, "type")
	}
	out, err := json.Marshal(fields)
	return out, err == nil
}

// builtinCallItem is the output item of a built-in's call.
type builtinCallItem struct {
	Type        string          `json:"type"`
	ID          string          `json:"id"`
	CallID      string          `json:"call_id"`
	Status      string          `json:"status"`
	Action      json.RawMessage `json:"action,omitempty"`
	Operation   json.RawMessage `json:"operation,omitempty"`
	Environment *environment    `json:"environment,omitempty"`
}

type environment struct {
	Type string `json:"type"`
}

// item is the call item of b with the model's arguments args.
func (b *builtinTool) item(id, callID, status string, args []byte) builtinCallItem {
	it := builtinCallItem{Type: b.call, ID: id, CallID: callID, Status: status}
	if b.field == "operation" {
		it.Operation = b.action(args)
	} else {
		it.Action = b.action(args)
	}
	if b.environment != "" {
		it.Environment = &environment{Type: b.environment}
	}
	return it
}

// shellOutput is one command's result in a shell_call_output item.
type shellOutput struct {
	Stdout  string `json:"stdout"`
	Stderr  string `json:"stderr"`
	Outcome struct {
		Type     string `json:"type"` // exit or timeout
		ExitCode *int64 `json:"exit_code"`
	} `json:"outcome"`
}

// shellOutputText is a shell_call_output's output as the text of a tool
// answer: each command's stdout, its stderr, and how it ended.
func shellOutputText(outputs []shellOutput) string {
	var b strings.Builder
	for i, o := range outputs {
		if i > 0 {
			b.WriteString("\n\n")
		}
		b.WriteString(o.Stdout)
		if o.Stderr != "" {
			if o.Stdout != "" && !strings.HasSuffix(o.Stdout, "\n") {
				b.WriteByte('\n')
			}
			b.WriteString("stderr:\n")
			b.WriteString(o.Stderr)
		}
		switch {
		case o.Outcome.Type == "timeout":
			b.WriteString("\n(timed out)")
		case o.Outcome.ExitCode != nil:
			b.WriteString("\n(exit code " + strconv.FormatInt(*o.Outcome.ExitCode, 10) + ")")
		}
	}
	return b.String()
}
