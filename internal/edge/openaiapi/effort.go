package openaiapi

import (
	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// OpenAI's reasoning effort levels (chat's reasoning_effort, the Responses
// API's reasoning.effort), each with the run's level it maps to
// (RunOptions.reasoning_effort in wire.proto; sdk.Effort* on the Node's
// side): the same word, but xhigh, which sits above high, is the wire's
// max, its highest (the adapters map max to their server's top level).
var effortLevels = map[string]string{
	"none": "none", "minimal": "minimal", "low": "low", "medium": "medium", "high": "high",
	"xhigh": "max", "max": "max",
}

// reasoningEffort sets o's reasoning effort from effort, the value of
// param: the run's level, and thinking off for none and on for any other.
// "" leaves the model's default; a level OpenAI does not define is 400.
func reasoningEffort(o *wirepb.RunOptions, param, effort string) *frontend.Failure {
	if effort == "" {
		return nil
	}
	level, ok := effortLevels[effort]
	if !ok {
		return invalid(param, "Unsupported value for %s: %q. Supported values are: none, minimal, low, medium, high, xhigh and max.", param, effort)
	}
	think := level != "none"
	o.ReasoningEffort, o.Think = level, &think
	return nil
}
