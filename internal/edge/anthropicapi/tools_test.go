package anthropicapi

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestToolFamily(t *testing.T) {
	for typ, want := range map[string][2]string{
		"":                                {"", ""},
		"custom":                          {"custom", ""},
		"web_search_20250305":             {"web_search", "20250305"},
		"text_editor_20250728":            {"text_editor", "20250728"},
		"tool_search_tool_bm25":           {"tool_search_tool_bm25", ""},
		"tool_search_tool_regex_20251119": {"tool_search_tool_regex", "20251119"},
		"mcp_toolset":                     {"mcp_toolset", ""},
		"bash_2025012x":                   {"bash_2025012x", ""},
		"bash_202501244":                  {"bash_202501244", ""},
	} {
		if f, v := toolFamily(typ); f != want[0] || v != want[1] {
			t.Errorf("toolFamily(%q) = %q, %q; want %q, %q", typ, f, v, want[0], want[1])
		}
	}
}

// Issue 21: Anthropic's client tools (the client runs them; Anthropic
// keeps their schemas in its models) are offered as functions of the name
// the client runs, with the schema their calls have; server tools, client
// toolsets and types the Edge does not know are hosted tools the run goes
// without, named by type.
func TestAnthropicsToolsAreFunctionsOrHosted(t *testing.T) {
	body := `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"tools":[
		{"name":"Read","input_schema":{"type":"object"},"defer_loading":true},
		{"type":"bash_20250124","name":"bash"},
		{"type":"text_editor_20250124","name":"str_replace_editor"},
		{"type":"text_editor_20250728","name":"str_replace_based_edit_tool","max_characters":10000},
		{"type":"text_editor_20250429"},
		{"type":"memory_20250818","name":"memory"},
		{"type":"computer_20251124","name":"computer","display_width_px":1280,"display_height_px":800},
		{"type":"computer_20241022","name":"computer_old"},
		{"type":"web_search_20250305","name":"web_search","max_uses":5,"cache_control":{"type":"ephemeral"}},
		{"type":"web_fetch_20250910","name":"web_fetch"},
		{"type":"code_execution_20250825","name":"code_execution"},
		{"type":"tool_search_tool_regex_20251119","name":"tool_search_tool_regex"},
		{"type":"advisor_20260301","name":"advisor","model":"x"},
		{"type":"mcp_toolset","mcp_server_name":"docs"},
		{"type":"browser_toolset_20260801"},
		{"type":"web_search_20250305","name":"web_search_again"},
		{"type":"telepathy_20990101","name":"mind"}]}`
	req, f := parseMessages([]byte(body))
	if f != nil {
		t.Fatalf("refused: %s", f.Message)
	}
	wantHosted := []string{"web_search_20250305", "web_fetch_20250910", "code_execution_20250825", "tool_search_tool_regex_20251119",
		"advisor_20260301", "mcp_toolset", "browser_toolset_20260801", "web_search_20250305", "telepathy_20990101"}
	if !slices.Equal(req.hosted, wantHosted) || req.hostedParam != "tools" {
		t.Errorf("hosted %v (%s), want %v", req.hosted, req.hostedParam, wantHosted)
	}
	type schema struct {
		Required   []string
		Properties map[string]struct{ Enum []string }
	}
	tools := req.run.GetTools()
	var got []string
	for _, wt := range tools {
		got = append(got, wt.GetName())
		var s schema
		if err := json.Unmarshal(wt.GetParametersJson(), &s); err != nil {
			t.Errorf("%s: the schema is not JSON: %v", wt.GetName(), err)
		}
	}
	want := []string{"Read", "bash", "str_replace_editor", "str_replace_based_edit_tool", "str_replace_based_edit_tool", "memory", "computer", "computer_old"}
	if !slices.Equal(got, want) {
		t.Fatalf("tools %v, want %v", got, want)
	}
	props := func(i int) schema {
		var s schema
		_ = json.Unmarshal(tools[i].GetParametersJson(), &s)
		return s
	}
	if p := props(1).Properties; len(p) != 2 || tools[1].GetDescription() == "" {
		t.Errorf("bash: %s", tools[1].GetParametersJson())
	}
	if p := props(2); !slices.Contains(p.Properties["command"].Enum, "undo_edit") || !slices.Equal(p.Required, []string{"command", "path"}) {
		t.Errorf("text_editor_20250124 has undo_edit: %s", tools[2].GetParametersJson())
	}
	if p := props(3).Properties; slices.Contains(p["command"].Enum, "undo_edit") {
		t.Errorf("text_editor_20250728 has no undo_edit: %s", tools[3].GetParametersJson())
	} else if _, ok := p["insert_text"]; !ok {
		t.Errorf("text_editor_20250728 inserts insert_text: %s", tools[3].GetParametersJson())
	}
	if p := props(5).Properties; !slices.Contains(p["command"].Enum, "rename") {
		t.Errorf("memory: %s", tools[5].GetParametersJson())
	}
	if p := props(6).Properties; !slices.Contains(p["action"].Enum, "zoom") || !strings.Contains(tools[6].GetDescription(), "1280×800") {
		t.Errorf("computer_20251124: %s %q", tools[6].GetParametersJson(), tools[6].GetDescription())
	}
	if p := props(7).Properties; slices.Contains(p["action"].Enum, "scroll") || !slices.Contains(p["action"].Enum, "screenshot") {
		t.Errorf("computer_20241022: %s", tools[7].GetParametersJson())
	}
}

// MCP servers Anthropic's API would connect to are hosted tools, named
// once, unless an mcp_toolset already names them; a value that is not a
// list is ignored.
func TestMCPServersAreHostedTools(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name, fields string
		hosted       []string
		param        string
	}{
		{"servers alone", `"mcp_servers":[{"type":"url","url":"https://x","name":"docs"}]`, []string{"mcp_servers"}, "mcp_servers"},
		{"servers beside a server tool", `"mcp_servers":[{"type":"url","url":"https://x","name":"docs"}],"tools":[{"type":"web_fetch_20250910","name":"web_fetch"}]`,
			[]string{"web_fetch_20250910", "mcp_servers"}, "tools"},
		{"servers named by a toolset", `"mcp_servers":[{"type":"url","url":"https://x","name":"docs"}],"tools":[{"type":"mcp_toolset","mcp_server_name":"docs"}]`,
			[]string{"mcp_toolset"}, "tools"},
		{"no servers", `"mcp_servers":[]`, nil, "tools"},
		{"not a list", `"mcp_servers":{"a":1}`, nil, "tools"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, f := parseMessages([]byte(`{"model":"m1","max_tokens":5,` + tt.fields + `,` + msgs + `}`))
			if f != nil {
				t.Fatalf("refused: %s", f.Message)
			}
			if !slices.Equal(req.hosted, tt.hosted) || req.hostedParam != tt.param {
				t.Errorf("hosted %v in %s, want %v in %s", req.hosted, req.hostedParam, tt.hosted, tt.param)
			}
		})
	}
}
