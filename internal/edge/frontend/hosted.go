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
	seen := make(map[string]bool, len(types))
	names := types[:0:0]
	for _, ty := range types {
		if !seen[ty] {
			seen[ty] = true
			names = append(names, ty)
		}
	}
	t.x.w.Header().Set(DroppedToolsHeader, strings.Join(names, ","))
	return nil
}
