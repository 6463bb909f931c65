package openaiapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
)

// hostedToolTypes are the Responses API's tool types only a hosted API
// runs: a request that declares them runs without them (named in
// X-IOP-Dropped-Tools) or is refused, as the route's profile says. The
// dated names are OpenAI's aliases of the same tools. tool_search and
// programmatic_tool_calling are OpenAI's own machinery over tools the
// Edge offers directly.
var hostedToolTypes = []string{
	"web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11",
	"file_search", "code_interpreter", "mcp", "computer", "computer_use_preview", "image_generation",
	"tool_search", "programmatic_tool_calling",
}

// respTool is a tool of a Responses request: flat, unlike chat's.
type respTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"`
	// Tools are a namespace's tools, decoded once the whole list is
	// (respTools), within the bound of the request's tools.
	Tools json.RawMessage `json:"tools"`
	// Format is a custom tool's input format.
	Format *customFormat `json:"format"`
	// Environment is where a shell tool runs: local (the default) or a
	// container at OpenAI.
	Environment *environment `json:"environment"`
	// raw is the tool as the client sent it, for the response's echo of
	// a tool other than a function.
	raw json.RawMessage
}

func (t *respTool) UnmarshalJSON(b []byte) error {
	type plain respTool
	if err := json.Unmarshal(b, (*plain)(t)); err != nil {
		return err
	}
	if t.Type != "function" {
		t.raw = slices.Clone(b) // b is the decoder's, valid only during the call
	}
	return nil
}

// respTools are the tools of a Responses request, made into the run's
// (the flat functions the model sees, and how each maps back), and the
// hosted tool types it declared.
func respTools(tools []respTool) (*toolset, []string, *frontend.Failure) {
	var decls []toolDecl
	var hosted []string
	n := len(tools) // the tools held, the namespaces' counted as they are decoded
	for i := range tools {
		t := &tools[i]
		param := fmt.Sprintf("tools[%d]", i)
		switch {
		case t.Type == "function" || t.Type == "custom":
			d, e := respToolDecl(t, "", "", param)
			if e != nil {
				return nil, nil, e
			}
			d.exact = true
			decls = append(decls, d)
		case t.Type == "namespace":
			if t.Name == "" {
				return nil, nil, invalid(param+".name", "A namespace tool needs a name.")
			}
			var members []respTool
			var err error
			if given(t.Tools) {
				members, err = frontdoor.DecodeList[respTool](t.Tools, MaxTools-n+1, param+".tools")
			}
			var le *frontdoor.ListTooLong
			switch {
			case errors.As(err, &le):
				return nil, nil, invalid(param+".tools", "Too many tools: at most %d are accepted, a namespace's tools included.", MaxTools)
			case err != nil:
				return nil, nil, jsonError(err)
			}
			n += len(members) - 1
			for j := range members {
				m := &members[j]
				mp := fmt.Sprintf("%s.tools[%d]", param, j)
				if m.Type != "function" && m.Type != "custom" {
					return nil, nil, invalid(mp+".type", "Unsupported tool type %q in a namespace: expected function or custom.", m.Type)
				}
				d, e := respToolDecl(m, t.Name, t.Description, mp)
				if e != nil {
					return nil, nil, e
				}
				decls = append(decls, d)
			}
		case t.Type == "shell" && t.Environment != nil && t.Environment.Type != "local":
			hosted = append(hosted, "shell") // runs in a container at OpenAI
		case builtinTools[t.Type] != nil:
			b := builtinTools[t.Type]
			decls = append(decls, toolDecl{declaredTool: declaredTool{kind: toolBuiltin, name: b.typ, builtin: b},
				description: b.description, parameters: b.parameters})
		case slices.Contains(hostedToolTypes, t.Type):
			hosted = append(hosted, t.Type)
		case t.Type == "":
			return nil, nil, invalid(param+".type", "A tool needs a type.")
		default:
			return nil, nil, invalid(param+".type", "Unsupported tool type %q: expected function, custom, namespace, "+
				"local_shell, shell, apply_patch, or a hosted tool (which the Edge drops).", t.Type)
		}
	}
	if len(decls) == 0 {
		return nil, hosted, nil
	}
	return newToolset(decls), hosted, nil
}

// respToolDecl is a function or custom tool t, in namespace (described as
// nsDescription) if not "".
func respToolDecl(t *respTool, namespace, nsDescription, param string) (toolDecl, *frontend.Failure) {
	if t.Name == "" {
		return toolDecl{}, invalid(param+".name", "A %s tool needs a name.", t.Type)
	}
	d := toolDecl{declaredTool: declaredTool{kind: toolFunction, name: t.Name, namespace: namespace}, description: t.Description}
	if t.Type == "custom" {
		d.kind, d.parameters = toolCustom, customParameters
		d.description = customDescription(t.Description, t.Format)
	} else if given(t.Parameters) {
		d.parameters = t.Parameters
	}
	if nsDescription != "" {
		d.description = withNote(d.description, "("+namespace+": "+nsDescription+")")
	}
	return d, nil
}

// echoTools are the tools a response repeats of its request: functions
// as OpenAI normalizes them, the others as the client sent them; hosted
// tools, which the request ran without, are left out.
func echoTools(tools []respTool) []any {
	out := []any{}
	for i := range tools {
		t := &tools[i]
		switch {
		case t.Type == "function":
			te := toolEcho{Type: "function", Name: t.Name}
			if given(t.Parameters) {
				te.Parameters = t.Parameters
			}
			if t.Description != "" {
				te.Description = &t.Description
			}
			if t.Strict != nil {
				te.Strict = *t.Strict
			}
			out = append(out, te)
		case slices.Contains(hostedToolTypes, t.Type), t.Type == "shell" && t.Environment != nil && t.Environment.Type != "local":
		default:
			out = append(out, t.raw)
		}
	}
	return out
}
