package fakemodel

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// The shell tools of the agents the integration tests run, with the
// parameters they declare (trimmed to what matters).
var (
	claudeBash = Tool{Name: "Bash", Parameters: json.RawMessage(`{"type":"object","properties":{
		"command":{"type":"string"},"timeout":{"type":"number","maximum":600000},
		"description":{"type":"string"},"run_in_background":{"type":"boolean"}},
		"required":["command"],"additionalProperties":false}`)}
	codexShell = Tool{Name: "shell", Parameters: json.RawMessage(`{"type":"object","properties":{
		"command":{"type":"array","items":{"type":"string"}},"workdir":{"type":"string"},
		"timeout_ms":{"type":"number"}},"required":["command"],"additionalProperties":false}`)}
	codexExec = Tool{Name: "exec_command", Parameters: json.RawMessage(`{"type":"object","properties":{
		"cmd":{"type":"string"},"yield_time_ms":{"type":"number"}},"required":["cmd"]}`)}
	readTool = Tool{Name: "Read", Parameters: json.RawMessage(`{"type":"object","properties":{
		"file_path":{"type":"string"},"limit":{"type":"integer","exclusiveMinimum":0}},"required":["file_path"]}`)}
)

// P7: the tool calls Claude Code and Codex can run, with arguments that fit
// their schemas.
func TestAgentCallsTheFirstPreferredToolOffered(t *testing.T) {
	cases := []struct {
		name  string
		agent Agent
		tools []Tool
		want  string
	}{
		{"Claude Code", Agent{}, []Tool{readTool, claudeBash}, `Bash {"command":"echo iop-agent-ok"}`},
		{"Codex shell takes argv", Agent{}, []Tool{codexShell}, `shell {"command":["bash","-lc","echo iop-agent-ok"]}`},
		{"Codex exec_command", Agent{}, []Tool{readTool, codexExec}, `exec_command {"cmd":"echo iop-agent-ok"}`},
		{"preference order wins over offer order", Agent{}, []Tool{codexExec, codexShell}, `shell {"command":["bash","-lc","echo iop-agent-ok"]}`},
		{"namespaced", Agent{}, []Tool{{Name: "functions.shell", Parameters: codexShell.Parameters}},
			`functions.shell {"command":["bash","-lc","echo iop-agent-ok"]}`},
		{"none preferred: the first offered", Agent{}, []Tool{readTool}, `Read {"file_path":"w1"}`},
		{"configured", Agent{Tools: []string{"Read"}, Command: "date", Shell: []string{"sh", "-c"}}, []Tool{codexShell, readTool},
			`Read {"file_path":"w1"}`},
		{"configured command", Agent{Command: "date", Shell: []string{"sh", "-c"}}, []Tool{codexShell},
			`shell {"command":["sh","-c","date"]}`},
		{"no parameters", Agent{}, []Tool{{Name: "now"}}, `now {}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := tc.agent.Decide(Turn{Tools: tc.tools}, []string{"w1", "w2"})
			if err != nil {
				t.Fatal(err)
			}
			if d.Call == nil || d.Text != "" {
				t.Fatalf("decision %+v", d)
			}
			if got := d.Call.Name + " " + string(d.Call.Arguments); got != tc.want {
				t.Fatalf("call %s, want %s", got, tc.want)
			}
		})
	}
}

func TestAgentQuotesTheToolResult(t *testing.T) {
	result := "iop-agent-ok\n\nexit code: 0\n"
	d, err := Agent{}.Decide(Turn{Tools: []Tool{claudeBash}, Result: &result}, nil)
	if err != nil || d.Call != nil || d.Text != "The command printed: iop-agent-ok exit code: 0" {
		t.Fatalf("%+v %v", d, err)
	}
	long := strings.Repeat("é", 300)
	d, _ = Agent{Reply: "Got: "}.Decide(Turn{Result: &long}, nil)
	if !strings.HasPrefix(d.Text, "Got: éé") || !strings.HasSuffix(d.Text, "…") || len(d.Text) > 5+maxQuote+len("…") {
		t.Fatalf("long result quoted as %q", d.Text)
	}
	empty := ""
	if d, _ := (Agent{}).Decide(Turn{Result: &empty}, nil); d.Text != "The command printed: (nothing)" {
		t.Fatalf("empty result quoted as %q", d.Text)
	}
}

func TestAgentHonoursToolChoice(t *testing.T) {
	result := "done"
	tools := []Tool{claudeBash, readTool}
	cases := []struct {
		name   string
		turn   Turn
		call   string
		text   string
		forced bool
	}{
		{"no tools: the model's own answer", Turn{}, "", "", false},
		{"none", Turn{Tools: tools, Choice: Choice{None: true}}, "", "", false},
		{"named", Turn{Tools: tools, Choice: Choice{Name: "Read"}}, "Read", "", false},
		{"named after a result", Turn{Tools: tools, Choice: Choice{Name: "Read"}, Result: &result}, "Read", "", false},
		{"required after a result", Turn{Tools: tools, Choice: Choice{Required: true}, Result: &result}, "Bash", "", false},
		{"named but not offered", Turn{Tools: tools, Choice: Choice{Name: "Write"}}, "", "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Agent{}.Decide(tc.turn, nil)
			if tc.forced {
				if !errors.Is(err, ErrForcedTool) {
					t.Fatalf("err %v, want ErrForcedTool", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			name := ""
			if d.Call != nil {
				name = d.Call.Name
			}
			if name != tc.call || d.Text != tc.text {
				t.Fatalf("decision %+v", d)
			}
		})
	}
}

func TestCallIDsDifferPerTurn(t *testing.T) {
	a, b := CallID("m", "turn one"), CallID("m", "turn one", "turn two")
	if a == b || a != CallID("m", "turn one") || !strings.HasPrefix(a, "call_") || len(a) != 29 {
		t.Fatalf("ids %q %q", a, b)
	}
}
