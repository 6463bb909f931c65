package frontend

import (
	"strings"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
)

// DroppedToolsHeader names, comma-separated, the hosted tools a request
// declared that the Edge ran it without: tools only a hosted API runs
// (web search, file search, code interpreter, MCP servers, computer use,
// image generation...), which no model server behind the Edge can.
const DroppedToolsHeader = "X-IOP-Dropped-Tools"

// DropHostedTools is how a translation says a request declared tools only
// a hosted API runs (types, as the API names them: "web_search",
// "code_interpreter"...). Under the route's profile's hosted_tools policy
// they are dropped (the default: the request runs without them, and
// DroppedToolsHeader names them) or refused: a 400 naming param and the
// first of them. No types is nil.
func (t *Turn) DropHostedTools(param string, types []string) *Failure {
	if len(types) == 0 {
		return nil
	}
	if t.Plan.Profile.HostedTools == edgeconfig.HostedToolsRefuse {
		return Invalid(param, "tool type %q is run only by a hosted API; this Edge refuses such tools for model %q (hosted_tools: refuse)",
			types[0], t.Plan.Model)
	}
	t.x.w.Header().Set(DroppedToolsHeader, joinOnce(types))
	return nil
}

// DroppedContentHeader names, comma-separated, the kinds of content a
// request carried that the model was given a placeholder for instead
// ("document:pdf", "image:url"...): content no model server behind the
// Edge reads.
const DroppedContentHeader = "X-IOP-Dropped-Content"

// DropContent is how a translation says it replaced content the model
// cannot read with a placeholder: the kinds, each once, in
// DroppedContentHeader. No kinds sets nothing.
func (t *Turn) DropContent(kinds []string) {
	if len(kinds) == 0 {
		return
	}
	t.x.w.Header().Set(DroppedContentHeader, joinOnce(kinds))
}

// joinOnce joins names with commas, each once, in their first order.
func joinOnce(names []string) string {
	seen := make(map[string]bool, len(names))
	var b strings.Builder
	for _, n := range names {
		if !seen[n] {
			if len(seen) > 0 {
				b.WriteByte(',')
			}
			seen[n] = true
			b.WriteString(n)
		}
	}
	return b.String()
}
