package anthropicapi

import (
	"strconv"
	"testing"
)

// P2, issue 21: thinking in every form Anthropic's clients send, and
// output_config.effort, become the run's think and reasoning_effort
// levels, not only on or off.
func TestThinkingAndEffortBecomeTheRunsReasoning(t *testing.T) {
	tests := []struct {
		name, fields string
		think        *bool
		effort       string
	}{
		{"neither", ``, nil, ""},
		{"effort alone", `"output_config":{"effort":"medium"}`, nil, effortMedium},
		{"enabled without a budget", `"thinking":{"type":"enabled"}`, ptr(true), ""},
		{"enabled, Anthropic's minimum budget", `"thinking":{"type":"enabled","budget_tokens":1024}`, ptr(true), effortLow},
		{"enabled, Claude Code's think", `"thinking":{"type":"enabled","budget_tokens":4000}`, ptr(true), effortLow},
		{"enabled, at the medium threshold", `"thinking":{"type":"enabled","budget_tokens":4096}`, ptr(true), effortMedium},
		{"enabled, Claude Code's think hard", `"thinking":{"type":"enabled","budget_tokens":10000}`, ptr(true), effortMedium},
		{"enabled, at the high threshold", `"thinking":{"type":"enabled","budget_tokens":16384}`, ptr(true), effortHigh},
		{"enabled, Claude Code's default", `"thinking":{"type":"enabled","budget_tokens":31999,"display":"summarized"}`, ptr(true), effortHigh},
		{"enabled, at the max threshold", `"thinking":{"type":"enabled","budget_tokens":32768}`, ptr(true), effortMax},
		{"enabled, a budget that is not positive", `"thinking":{"type":"enabled","budget_tokens":0}`, ptr(true), ""},
		{"enabled, effort over the budget", `"thinking":{"type":"enabled","budget_tokens":50000},"output_config":{"effort":"low"}`, ptr(true), effortLow},
		{"adaptive, omitted display (Claude Code)", `"thinking":{"type":"adaptive","display":"omitted"}`, ptr(true), ""},
		{"adaptive with Claude Code's effort", `"thinking":{"type":"adaptive","display":"omitted"},"output_config":{"effort":"high"}`, ptr(true), effortHigh},
		{"between_tools", `"thinking":{"type":"between_tools"}`, ptr(true), ""},
		{"disabled", `"thinking":{"type":"disabled"}`, ptr(false), effortNone},
		{"disabled wins over an effort", `"thinking":{"type":"disabled"},"output_config":{"effort":"max"}`, ptr(false), effortNone},
		{"xhigh is the wire's max", `"output_config":{"effort":"xhigh"}`, nil, effortMax},
		{"max", `"thinking":{"type":"adaptive"},"output_config":{"effort":"max"}`, ptr(true), effortMax},
		{"effort beside a format", `"output_config":{"effort":"low","format":{"type":"json_schema","schema":{"type":"object"}}}`, nil, effortLow},
		{"thinking null", `"thinking":null`, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"m1","max_tokens":64000,"messages":[{"role":"user","content":"hi"}]}`
			if tt.fields != "" {
				body = `{"model":"m1","max_tokens":64000,` + tt.fields + `,"messages":[{"role":"user","content":"hi"}]}`
			}
			req, f := parseMessages([]byte(body))
			if f != nil {
				t.Fatalf("refused: %s", f.Message)
			}
			o := req.run.GetOptions()
			if show(o.Think) != show(tt.think) || o.GetReasoningEffort() != tt.effort {
				t.Errorf("think %s, effort %q; want %s, %q", show(o.Think), o.GetReasoningEffort(), show(tt.think), tt.effort)
			}
		})
	}
}

// show is an optional bool as a test's message says it.
func show(b *bool) string {
	if b == nil {
		return "unset"
	}
	return strconv.FormatBool(*b)
}
