package anthropicapi

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// A request's tools are of three kinds (Anthropic's tool reference,
// platform.claude.com/docs/en/agents-and-tools/tool-use/tool-reference):
//
//   - custom tools (no type, or "custom"): a name, a description and an
//     input_schema, offered as they are;
//   - Anthropic's client tools (bash_*, text_editor_*, memory_*,
//     computer_*): Anthropic defines the schema, which it keeps inside its
//     models and never sends, and the client runs the tool. The Edge gives
//     each the schema its calls have (clientToolSchema), so that the model
//     behind it is offered a function of the name the client runs, and the
//     calls come back as tool_use blocks the client already handles;
//   - everything else: Anthropic's server tools (web_search_*,
//     web_fetch_*, code_execution_*, tool_search_tool_*, advisor_*,
//     mcp_toolset), which Anthropic's API runs, and the client toolsets
//     (browser_toolset_*, computer_toolset_*), families of tools whose
//     members and schemas only Anthropic's API knows. No model server
//     behind the Edge can be offered them: they are hosted tools
//     (frontend.Turn.DropHostedTools), dropped and named in
//     X-IOP-Dropped-Tools, or refused per profile. A type this package does
//     not know is one of these too: Anthropic adds tools by version, and a
//     new one should cost the client its tool, named, not the request.
//
// defer_loading, cache_control, strict, input_examples, allowed_callers
// and eager_input_streaming are accepted on any tool and ignored: a
// deferred tool is offered as any other (the tool search that would load
// it is a server tool, dropped).

// toolsOf converts a request's tools: the run's tools, and the hosted ones
// the run goes without (their types, in order, and name → type, for a
// tool_choice that names one).
func toolsOf(tools toolList) (run []*wirepb.Tool, hosted []string, hostedNames map[string]string, f *frontend.Failure) {
	for i, t := range tools {
		field := fmt.Sprintf("tools.%d", i)
		family, version := toolFamily(t.Type)
		switch family {
		case "", "custom":
			if t.Name == "" {
				return nil, nil, nil, invalid(field+".name", "Field required")
			}
			wt := &wirepb.Tool{Name: t.Name, Description: t.Description}
			if s := bytes.TrimSpace(t.InputSchema); len(s) > 0 && !bytes.Equal(s, []byte("null")) {
				wt.ParametersJson = s
			}
			run = append(run, wt)
		case "bash", "text_editor", "memory", "computer":
			run = append(run, clientTool(&t, family, version))
		default:
			hosted = append(hosted, t.Type)
			if t.Name != "" {
				if hostedNames == nil {
					hostedNames = map[string]string{}
				}
				hostedNames[t.Name] = t.Type
			}
		}
	}
	return run, hosted, hostedNames, nil
}

// toolFamily splits a versioned tool type ("text_editor_20250728") into
// its family and its version date; a type without a date is its own
// family ("custom", "mcp_toolset", "tool_search_tool_bm25").
func toolFamily(typ string) (family, version string) {
	i := strings.LastIndexByte(typ, '_')
	if i < 0 || len(typ)-i-1 != 8 {
		return typ, ""
	}
	for _, c := range typ[i+1:] {
		if c < '0' || c > '9' {
			return typ, ""
		}
	}
	return typ[:i], typ[i+1:]
}

// clientTool is one of Anthropic's client tools as a function: the name
// the client gave it (or the one Anthropic's API gives that version), the
// schema of its calls, and a description that tells the model what
// Anthropic's models know of it.
func clientTool(t *tool, family, version string) *wirepb.Tool {
	wt := &wirepb.Tool{Name: t.Name}
	switch family {
	case "bash":
		wt.Description, wt.ParametersJson = bashDescription, []byte(bashSchema)
		if wt.Name == "" {
			wt.Name = "bash"
		}
	case "text_editor":
		// Until text_editor_20250429 the tool was str_replace_editor, with
		// undo_edit, and insert took its text in new_str; since, it is
		// str_replace_based_edit_tool, without undo_edit, and Anthropic's
		// models send insert's text in insert_text (what they do, which is
		// what clients answer; Anthropic's docs said new_str for a while).
		if version != "" && version < "20250429" {
			wt.Description, wt.ParametersJson = editorDescription, []byte(editorSchemaOld)
			if wt.Name == "" {
				wt.Name = "str_replace_editor"
			}
		} else {
			wt.Description, wt.ParametersJson = editorDescription, []byte(editorSchema)
			if wt.Name == "" {
				wt.Name = "str_replace_based_edit_tool"
			}
		}
	case "memory":
		wt.Description, wt.ParametersJson = memoryDescription, []byte(memorySchema)
		if wt.Name == "" {
			wt.Name = "memory"
		}
	case "computer":
		actions := computerActions20241022
		if version == "" || version >= "20250124" {
			actions += computerActions20250124
		}
		if version == "" || version >= "20251124" {
			actions += `,"zoom"`
		}
		wt.Description = computerDescription
		if t.DisplayWidthPx != nil && t.DisplayHeightPx != nil {
			wt.Description += fmt.Sprintf(" The screen is %d×%d pixels.", *t.DisplayWidthPx, *t.DisplayHeightPx)
		}
		wt.ParametersJson = []byte(fmt.Sprintf(computerSchema, actions))
		if wt.Name == "" {
			wt.Name = "computer"
		}
	}
	return wt
}

// The schemas of Anthropic's client tools: the inputs their calls carry,
// as the tool's documentation lists them (the model is told the rules in
// the description and the properties' own).
const (
	bashDescription = "Run a command in a persistent bash shell: state (the working directory, variables) " +
		"carries from one call to the next. Set restart to true to start a fresh shell."
	bashSchema = `{"type":"object","properties":{` +
		`"command":{"type":"string","description":"The command to run."},` +
		`"restart":{"type":"boolean","description":"Restart the shell instead of running a command."}}}`

	editorDescription = "View, create and edit text files. view shows a file with line numbers (or lists a directory); " +
		"create writes a new file; str_replace replaces old_str, which must occur exactly once in the file, with new_str; " +
		"insert adds text after line insert_line (0: at the top)."
	editorProps = `"path":{"type":"string","description":"Absolute path of the file or directory."},` +
		`"file_text":{"type":"string","description":"create: the new file's content."},` +
		`"old_str":{"type":"string","description":"str_replace: the exact text to replace, unique in the file."},` +
		`"insert_line":{"type":"integer","description":"insert: the line after which the text goes, 0 for the top."},` +
		`"view_range":{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":2,` +
		`"description":"view: the first and last line to show, 1-based; -1 as the last means the end of the file."}`
	editorSchemaOld = `{"type":"object","required":["command","path"],"properties":{` +
		`"command":{"type":"string","enum":["view","create","str_replace","insert","undo_edit"],` +
		`"description":"What to do; undo_edit reverts the last edit of path."},` +
		`"new_str":{"type":"string","description":"str_replace: the replacement text; insert: the text to insert."},` +
		editorProps + `}}`
	editorSchema = `{"type":"object","required":["command","path"],"properties":{` +
		`"command":{"type":"string","enum":["view","create","str_replace","insert"],"description":"What to do."},` +
		`"new_str":{"type":"string","description":"str_replace: the replacement text."},` +
		`"insert_text":{"type":"string","description":"insert: the text to insert."},` +
		editorProps + `}}`

	memoryDescription = "Read and write your memory: files under /memories that persist from one conversation to the next. " +
		"view a file or directory, create a file, str_replace a unique string in it, insert text after a line, delete, rename."
	memorySchema = `{"type":"object","required":["command"],"properties":{` +
		`"command":{"type":"string","enum":["view","create","str_replace","insert","delete","rename"],"description":"What to do."},` +
		`"path":{"type":"string","description":"The file or directory, under /memories."},` +
		`"view_range":{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":2,"description":"view: the first and last line to show."},` +
		`"file_text":{"type":"string","description":"create: the file's content."},` +
		`"old_str":{"type":"string","description":"str_replace: the exact text to replace, unique in the file."},` +
		`"new_str":{"type":"string","description":"str_replace: the replacement text."},` +
		`"insert_line":{"type":"integer","description":"insert: the line after which the text goes, 0 for the top."},` +
		`"insert_text":{"type":"string","description":"insert: the text to insert."},` +
		`"old_path":{"type":"string","description":"rename: the current path."},` +
		`"new_path":{"type":"string","description":"rename: the new path."}}}`

	computerDescription = "Control the computer's screen, mouse and keyboard. Take a screenshot to see the screen; " +
		"coordinates are [x, y] pixels from the top left."
	computerActions20241022 = `"key","type","mouse_move","left_click","left_click_drag","right_click","middle_click",` +
		`"double_click","screenshot","cursor_position"`
	computerActions20250124 = `,"scroll","left_mouse_down","left_mouse_up","hold_key","wait","triple_click"`
	// computerSchema takes the action enum's members (%s).
	computerSchema = `{"type":"object","required":["action"],"properties":{` +
		`"action":{"type":"string","enum":[%s],"description":"What to do."},` +
		`"coordinate":{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":2,"description":"[x, y] of a click, move or scroll."},` +
		`"start_coordinate":{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":2,"description":"left_click_drag: where the drag starts."},` +
		`"text":{"type":"string","description":"type: the text; key and hold_key: the key or combination (\"ctrl+s\"); a click: keys held during it."},` +
		`"scroll_direction":{"type":"string","enum":["up","down","left","right"]},` +
		`"scroll_amount":{"type":"integer","description":"scroll: how many notches."},` +
		`"duration":{"type":"number","description":"hold_key and wait: seconds."},` +
		`"region":{"type":"array","items":{"type":"integer"},"minItems":4,"maxItems":4,"description":"zoom: [x1, y1, x2, y2] of the area to see closer."}}}`
)

// hostedChoice is the failure of a tool_choice that forces a hosted tool
// the run goes without.
func hostedChoice(name, typ string) *frontend.Failure {
	return invalid("tool_choice.name", "the tool %q (%s) is run only by Anthropic's API: the Edge runs the request without it, so it cannot be forced", name, typ)
}
