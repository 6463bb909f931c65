package sdk

import (
	"errors"
	"testing"
)

// P2: a tool choice an adapter cannot make sense of is refused, never
// ignored.
func TestToolChoiceCheck(t *testing.T) {
	tools := []Tool{{Name: "get_weather"}}
	tests := []struct {
		choice ToolChoice
		tools  []Tool
		ok     bool
	}{
		{"", nil, true},
		{ToolChoiceAuto, nil, true},
		{ToolChoiceNone, tools, true},
		{ToolChoiceRequired, tools, true},
		{ToolChoiceRequired, nil, false},
		{ToolChoiceFunction("get_weather"), tools, true},
		{ToolChoiceFunction("other"), tools, false},
		{ToolChoiceFunction(""), tools, false},
		{"function", tools, false},
		{"any", tools, false},
	}
	for _, tt := range tests {
		err := tt.choice.Check(tt.tools)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidRequest)) {
			t.Errorf("%q with %d tools: %v", tt.choice, len(tt.tools), err)
		}
	}
	if name, ok := ToolChoiceFunction("f").Function(); !ok || name != "f" {
		t.Errorf("Function() = %q, %v", name, ok)
	}
	for c, forces := range map[ToolChoice]bool{"": false, "auto": false, "none": false, "required": true, "function:f": true} {
		if c.Forces() != forces {
			t.Errorf("%q.Forces() = %v", c, !forces)
		}
	}
}
