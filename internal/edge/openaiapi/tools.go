package openaiapi

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Tools as a client declares them, and as a model server sees them.
//
// A model server knows one kind of tool: a function, with a JSON schema of
// its arguments, called with a JSON object. OpenAI's APIs declare more
// kinds; the Edge offers each to the model as a function, and maps the
// model's calls back to the kind the client declared (toolset):
//
//	function                    itself, under its own name
//	namespace (Responses)       each of its functions and custom tools under a
//	                            flat name, NAMESPACE__NAME (valid as a function
//	                            name everywhere: ^[a-zA-Z0-9_-]{1,64}$; made
//	                            unique with a hash when it is taken or too
//	                            long); the namespace's description is appended
//	                            to each one's; a call answers as the inner name
//	                            with its namespace
//	custom                      a function of one string, {"input": "..."};
//	                            its format (a grammar) is told to the model in
//	                            the description, not enforced; a call answers
//	                            as a custom tool call whose input is the string
//	local_shell, shell,         tools the client runs itself (Responses):
//	apply_patch                 functions of their action's fields; a call
//	                            answers as a local_shell_call, shell_call or
//	                            apply_patch_call item (builtinTool)
//	hosted tools                run only by a hosted API: dropped, and named in
//	                            X-IOP-Dropped-Tools, or refused per profile
//	                            (frontend.Turn.DropHostedTools)
//
// Top-level names are kept as the client wrote them. Names the Edge makes
// (a namespace's members, the built-ins) yield to them.

// toolKind is the kind of tool a client declared.
type toolKind uint8

const (
	toolFunction toolKind = iota
	toolCustom
	toolBuiltin
)

// maxFunctionName is the longest function name every provider takes.
const maxFunctionName = 64

// customParameters are the parameters of the function a custom tool is
// offered as: one string.
var customParameters = []byte(`{"type":"object","properties":{"input":{"type":"string"}},"required":["input"]}`)

// declaredTool is a tool of the run as the client declared it.
type declaredTool struct {
	// flat is the name the model sees (the run's tool's name).
	flat      string
	kind      toolKind
	name      string // the client's name: the inner name in a namespace; a built-in's type
	namespace string
	builtin   *builtinTool // kind toolBuiltin
}

// toolDecl is one tool to offer: how it was declared and what the model
// reads of it.
type toolDecl struct {
	declaredTool
	description string
	parameters  json.RawMessage
	// exact: the client named it at the top level, and the model sees
	// that name as it is.
	exact bool
}

// declKey identifies a declared tool.
type declKey struct {
	kind      toolKind
	namespace string
	name      string
}

// toolset is the tools of a run: what the model is offered, and how each
// of its calls maps back to what the client declared. A nil toolset has
// no tools: every name is a plain function's.
type toolset struct {
	run    []*wirepb.Tool
	byFlat map[string]*declaredTool
	byDecl map[declKey]*declaredTool
	// byInner are namespace members by their inner name, for a
	// tool_choice that names one without its namespace; nil values mark
	// names found in more than one namespace.
	byInner map[string]*declaredTool
}

// newToolset names decls for the model and makes the run's tools, in
// declaration order. Names a client wrote at the top level are kept (the
// first of two tools of different kinds with one name keeps it); the
// others get their preferred name when it is free and valid, else a
// unique one.
func newToolset(decls []toolDecl) *toolset {
	s := &toolset{
		run:    make([]*wirepb.Tool, len(decls)),
		byFlat: make(map[string]*declaredTool, len(decls)),
		byDecl: make(map[declKey]*declaredTool, len(decls)),
	}
	for pass := range 2 {
		for i := range decls {
			d := &decls[i]
			if d.exact != (pass == 0) {
				continue
			}
			key := declKey{d.kind, d.namespace, d.name}
			switch again := s.byDecl[key]; {
			case again != nil:
				d.flat = again.flat // declared again: one tool to the model, as before
			case pass == 0 && s.byFlat[d.name] == nil:
				d.flat = d.name
			default:
				d.flat = s.unique(preferredName(d.namespace, d.name), key)
			}
			t := &d.declaredTool
			if prev := s.byFlat[d.flat]; prev != nil {
				t = prev
			} else {
				s.byFlat[d.flat] = t
			}
			if _, ok := s.byDecl[key]; !ok {
				s.byDecl[key] = t
			}
			if d.namespace != "" {
				if s.byInner == nil {
					s.byInner = map[string]*declaredTool{}
				}
				if prev, seen := s.byInner[d.name]; seen && prev != t {
					s.byInner[d.name] = nil
				} else {
					s.byInner[d.name] = t
				}
			}
			s.run[i] = &wirepb.Tool{Name: d.flat, Description: d.description, ParametersJson: d.parameters}
		}
	}
	return s
}

// preferredName is the name the model should see for a tool in namespace
// named name, before uniqueness: the name itself, or NAMESPACE__NAME, made
// of the characters every provider takes.
func preferredName(namespace, name string) string {
	if namespace == "" {
		return validName(name)
	}
	return validName(namespace) + "__" + validName(name)
}

// validName replaces what a function name may not hold with "_".
func validName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	return string(b)
}

// unique returns name if it is free and short enough, else name cut short
// with a tag of key's hash (and a counter, should even that be taken).
func (s *toolset) unique(name string, key declKey) string {
	if name != "" && len(name) <= maxFunctionName && s.byFlat[name] == nil {
		return name
	}
	sum := sha256.Sum256([]byte(strconv.Itoa(int(key.kind)) + "\x00" + key.namespace + "\x00" + key.name))
	tag := "_" + hex.EncodeToString(sum[:4])
	for n := 0; ; n++ {
		suffix := tag
		if n > 0 {
			suffix += strconv.Itoa(n)
		}
		c := name[:min(len(name), maxFunctionName-len(suffix))] + suffix
		if s.byFlat[c] == nil {
			return c
		}
	}
}

// tools are the run's tools (nil for none).
func (s *toolset) tools() []*wirepb.Tool {
	if s == nil || len(s.run) == 0 {
		return nil
	}
	return s.run
}

// declared is how the client declared the run's tool named flat; nil for
// a name the run does not offer (a call of it answers as a function's).
func (s *toolset) declared(flat string) *declaredTool {
	if s == nil {
		return nil
	}
	return s.byFlat[flat]
}

// flatName is the name the model sees for a tool declared as kind, in
// namespace, named name (a built-in by its type): the run's, or, for a
// tool this request does not declare (a call of an earlier turn), the
// name it would be offered under, so that a history reads the same from
// turn to turn.
func (s *toolset) flatName(kind toolKind, namespace, name string) string {
	if s != nil {
		if d := s.byDecl[declKey{kind, namespace, name}]; d != nil {
			return d.flat
		}
	}
	if namespace == "" {
		return name
	}
	return preferredName(namespace, name)
}

// chosen is the run's tool a tool_choice names: by kind and name (in
// namespace, if it names one), else a namespace member by its inner name
// alone when only one namespace has it, else the name the model sees.
// "" if none.
func (s *toolset) chosen(kind toolKind, namespace, name string) string {
	if s == nil {
		return ""
	}
	if d := s.byDecl[declKey{kind, namespace, name}]; d != nil {
		return d.flat
	}
	if d := s.byInner[name]; namespace == "" && d != nil && d.kind == kind {
		return d.flat
	}
	if d := s.byFlat[name]; d != nil && d.kind == kind {
		return d.flat
	}
	return ""
}

// customDescription is the description of the function a custom tool is
// offered as: its own, and what its format asks of the input, which the
// Edge does not enforce (a model server has no grammar-constrained
// decoding behind this API), so the model is told.
func customDescription(description string, f *customFormat) string {
	if f == nil {
		return description
	}
	syntax, definition := f.Syntax, f.Definition
	if f.Grammar != nil { // chat's shape: {"type":"grammar","grammar":{...}}
		syntax, definition = f.Grammar.Syntax, f.Grammar.Definition
	}
	if f.Type != "grammar" || definition == "" {
		return description
	}
	if syntax == "" {
		syntax = "the"
	}
	note := "The input must follow " + syntax + " grammar:\n" + definition
	return withNote(strings.TrimSpace(description), note)
}

// customFormat is a custom tool's input format: {"type":"text"}, or a
// grammar (Responses: syntax and definition beside type; chat: in
// "grammar").
type customFormat struct {
	Type       string `json:"type"`
	Syntax     string `json:"syntax"`
	Definition string `json:"definition"`
	Grammar    *struct {
		Syntax     string `json:"syntax"`
		Definition string `json:"definition"`
	} `json:"grammar"`
}

// customInput is the string a model's call of a custom tool passes: the
// "input" of its arguments, or, when they are not that object (a model that
// wrote the text itself), the arguments as they are.
func customInput(args []byte) string {
	var v struct {
		Input *string `json:"input"`
	}
	if err := json.Unmarshal(args, &v); err == nil && v.Input != nil {
		return *v.Input
	}
	return string(args)
}

// customArguments are the arguments of a custom tool call of input, as
// the model sees them in a history.
func customArguments(input string) []byte {
	b, _ := json.Marshal(struct {
		Input string `json:"input"`
	}{input}) // a string always marshals
	return b
}

// withNote is a description with a paragraph added.
func withNote(description, note string) string {
	if description == "" {
		return note
	}
	return description + "\n\n" + note
}
