package anthropicapi

import (
	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The run's reasoning effort levels this API maps onto (RunOptions.
// reasoning_effort in wire.proto; sdk.Effort* on the Node's side).
const (
	effortNone   = "none"
	effortLow    = "low"
	effortMedium = "medium"
	effortHigh   = "high"
	effortMax    = "max"
)

// Thinking budgets (thinking.budget_tokens) from which a budget maps to a
// higher effort: below budgetMedium low, below budgetHigh medium, below
// budgetMax high, from it max. A budget is Anthropic's way of saying how
// hard to think, and a provider's nearest words for it are levels, so the
// thresholds sit between the budgets clients send for each degree of it:
// Anthropic's minimum (1,024) and Claude Code's "think" (4,000) are low;
// its "think hard" (10,000) and Gemini's medium (8,192) are medium; Claude
// Code's default when thinking is on (31,999) and Gemini's high (24,576)
// are high; only past 32k, where Anthropic's own guidance says a request
// is exceptional, is it max. Powers of two, so that a client that picks a
// round budget lands where it means.
const (
	budgetMedium = 4 << 10
	budgetHigh   = 16 << 10
	budgetMax    = 32 << 10
)

// budgetEffort is the effort of a thinking budget: "" (the model's
// default) for none or one that is not positive.
func budgetEffort(budget *int64) string {
	switch b := budget; {
	case b == nil || *b <= 0:
		return ""
	case *b < budgetMedium:
		return effortLow
	case *b < budgetHigh:
		return effortMedium
	case *b < budgetMax:
		return effortHigh
	}
	return effortMax
}

// outputEffort is the run's effort for output_config.effort: low, medium
// and high as they are; xhigh and max as max, the wire's highest level
// (Anthropic's xhigh sits between its high and max, and a provider's own
// top level, which the adapters map max to, is the nearest to both). ""
// when it is not set; an effort Anthropic does not define is 400.
func outputEffort(effort string) (string, *frontend.Failure) {
	switch effort {
	case "":
		return "", nil
	case effortLow, effortMedium, effortHigh:
		return effort, nil
	case "xhigh", effortMax:
		return effortMax, nil
	}
	return "", invalid("output_config.effort", "unsupported effort %q: expected low, medium, high, xhigh or max", effort)
}

// reasoning sets o's think and reasoning_effort from thinking and
// output_config.effort:
//
//	thinking absent                 effort from output_config ("" without)
//	{type:"enabled", budget_tokens} think on; effort from output_config,
//	                                else from the budget (budgetEffort)
//	{type:"adaptive"}, {type:"between_tools"}
//	                                think on; effort from output_config, else
//	                                "" (the model decides how much)
//	{type:"disabled"}               think off, effort none (output_config's
//	                                effort, which then shapes only Claude's
//	                                text, has no meaning for a provider here)
//
// display (summarized, omitted) is accepted and not honoured: the thinking
// a provider streams is relayed, which also keeps a long reasoning phase
// from being a silent stream that proxies cut. An unknown type is 400.
func (req *messagesRequest) reasoning(o *wirepb.RunOptions) *frontend.Failure {
	var requested string
	if oc := req.OutputConfig; oc != nil {
		var f *frontend.Failure
		if requested, f = outputEffort(oc.Effort); f != nil {
			return f
		}
	}
	th := req.Thinking
	if th == nil {
		o.ReasoningEffort = requested
		return nil
	}
	on := true
	switch th.Type {
	case "enabled":
		if requested == "" {
			requested = budgetEffort(th.BudgetTokens)
		}
	case "adaptive", "between_tools":
	case "disabled":
		on, requested = false, effortNone
	default:
		return invalid("thinking.type", "unsupported thinking type %q: expected enabled, adaptive, between_tools or disabled", th.Type)
	}
	o.Think, o.ReasoningEffort = &on, requested
	return nil
}
