package openaiapi

import (
	"regexp"
	"strings"
	"testing"
)

// validFunctionName is what every provider takes as a function's name.
var validFunctionName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// P2: the tools a client declares are offered to the model as functions
// under names every provider takes; the client's own top-level names are
// kept, and the names the Edge makes yield to them.
func TestToolsetNamesWhatTheModelSees(t *testing.T) {
	fn := func(name string) toolDecl {
		return toolDecl{declaredTool: declaredTool{kind: toolFunction, name: name}, exact: true}
	}
	member := func(ns, name string) toolDecl {
		return toolDecl{declaredTool: declaredTool{kind: toolFunction, namespace: ns, name: name}}
	}
	custom := func(name string) toolDecl {
		return toolDecl{declaredTool: declaredTool{kind: toolCustom, name: name}, exact: true}
	}
	builtin := func(typ string) toolDecl {
		return toolDecl{declaredTool: declaredTool{kind: toolBuiltin, name: typ, builtin: builtinTools[typ]}}
	}
	long := strings.Repeat("n", 40)
	tests := []struct {
		name  string
		decls []toolDecl
		want  []string // the run's tools' names, in order; "~prefix" for a hashed name with that prefix
	}{
		{"functions keep their names", []toolDecl{fn("get_weather"), fn("exec_command")}, []string{"get_weather", "exec_command"}},
		{"a namespace's members are NAMESPACE__NAME", []toolDecl{member("multi_agent_v1", "spawn_agent"), member("multi_agent_v1", "wait")},
			[]string{"multi_agent_v1__spawn_agent", "multi_agent_v1__wait"}},
		{"characters a function name may not hold become _", []toolDecl{member("crm.v1", "find contact")},
			[]string{"crm_v1__find_contact"}},
		{"a name past 64 characters is cut and tagged", []toolDecl{member(long, long)}, []string{"~" + long}},
		{"a top-level name wins over a member's, declared before or after",
			[]toolDecl{member("a", "b"), fn("a__b")}, []string{"~a__b_", "a__b"}},
		{"two members whose names read the same differ", []toolDecl{member("a.b", "c"), member("a_b", "c")},
			[]string{"a_b__c", "~a_b__c_"}},
		{"a built-in takes its type's name", []toolDecl{builtin("local_shell"), builtin("apply_patch")},
			[]string{"local_shell", "apply_patch"}},
		{"a built-in yields to a function of its name", []toolDecl{builtin("shell"), fn("shell")}, []string{"~shell_", "shell"}},
		{"a custom tool and a function of one name: the first keeps it", []toolDecl{fn("x"), custom("x")}, []string{"x", "~x_"}},
		{"a repeated function is one name", []toolDecl{fn("f"), fn("f")}, []string{"f", "f"}},
		{"a repeated member is one name", []toolDecl{member("ns", "f"), member("ns", "f")}, []string{"ns__f", "ns__f"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newToolset(tt.decls)
			var got []string
			for i, tool := range s.tools() {
				got = append(got, tool.GetName())
				w := tt.want[i]
				if prefix, hashed := strings.CutPrefix(w, "~"); hashed {
					if !strings.HasPrefix(tool.GetName(), prefix[:min(len(prefix), 40)]) || tool.GetName() == prefix {
						t.Errorf("tool %d: %q, want a tagged name from %q", i, tool.GetName(), prefix)
					}
				} else if tool.GetName() != w {
					t.Errorf("tool %d: %q, want %q", i, tool.GetName(), w)
				}
				if !validFunctionName.MatchString(tool.GetName()) {
					t.Errorf("tool %d: %q is not a valid function name", i, tool.GetName())
				}
				if d := s.declared(tool.GetName()); d == nil || d.flat != tool.GetName() {
					t.Errorf("tool %d: %q maps back to %+v", i, tool.GetName(), d)
				}
			}
			seen := map[string]bool{}
			for i, d := range tt.decls {
				flat := s.tools()[i].GetName()
				if seen[flat] {
					continue // a repeat
				}
				if back := s.declared(flat); back.kind != d.kind || back.name != d.name || back.namespace != d.namespace {
					t.Errorf("%q maps back to %+v, want %+v", flat, back, d.declaredTool)
				}
				if s.flatName(d.kind, d.namespace, d.name) != flat {
					t.Errorf("flatName(%v, %q, %q) = %q, want %q", d.kind, d.namespace, d.name, s.flatName(d.kind, d.namespace, d.name), flat)
				}
				seen[flat] = true
			}
			t.Logf("%q", got)
		})
	}
}

// A call of an earlier turn names a tool this request may not declare: it
// reads as the name it would be offered under, the same every turn.
func TestFlatNameOfAnUndeclaredTool(t *testing.T) {
	var s *toolset
	for _, c := range []struct {
		kind          toolKind
		ns, name, out string
	}{
		{toolFunction, "", "f", "f"},
		{toolFunction, "multi_agent_v1", "wait", "multi_agent_v1__wait"},
		{toolCustom, "", "apply_patch", "apply_patch"},
		{toolBuiltin, "", "shell", "shell"},
	} {
		if got := s.flatName(c.kind, c.ns, c.name); got != c.out {
			t.Errorf("flatName(%q, %q) = %q, want %q", c.ns, c.name, got, c.out)
		}
	}
}

// A custom tool's grammar is told to the model, in both APIs' shapes.
func TestCustomDescriptionCarriesTheGrammar(t *testing.T) {
	responses := &customFormat{Type: "grammar", Syntax: "lark", Definition: "start: /.+/"}
	chat := &customFormat{Type: "grammar"}
	chat.Grammar = &struct {
		Syntax     string `json:"syntax"`
		Definition string `json:"definition"`
	}{"regex", `\d+`}
	for _, c := range []struct {
		desc string
		f    *customFormat
		want string
	}{
		{"Edits files.", nil, "Edits files."},
		{"Edits files.", &customFormat{Type: "text"}, "Edits files."},
		{"Edits files.", responses, "Edits files.\n\nThe input must follow lark grammar:\nstart: /.+/"},
		{"", chat, "The input must follow regex grammar:\n\\d+"},
	} {
		if got := customDescription(c.desc, c.f); got != c.want {
			t.Errorf("customDescription(%q, %+v) = %q, want %q", c.desc, c.f, got, c.want)
		}
	}
}
