package wirepb

import "testing"

// Every run event type is classified here on purpose: a type added to
// wire.proto fails this test until someone decides whether it ends a run.
func TestIsTerminalClassifiesEveryType(t *testing.T) {
	want := map[RunEventType]bool{
		RunEventType_RUN_EVENT_TYPE_UNSPECIFIED:       false,
		RunEventType_RUN_EVENT_TYPE_TEXT_DELTA:        false,
		RunEventType_RUN_EVENT_TYPE_REASONING_DELTA:   false,
		RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA:   false,
		RunEventType_RUN_EVENT_TYPE_USAGE:             false,
		RunEventType_RUN_EVENT_TYPE_COMPLETED:         true,
		RunEventType_RUN_EVENT_TYPE_FAILED:            true,
		RunEventType_RUN_EVENT_TYPE_CANCELLED:         true,
		RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED:  true,
		RunEventType_RUN_EVENT_TYPE_DEADLINE_EXCEEDED: true,
		RunEventType_RUN_EVENT_TYPE_DISCONNECTED:      true,
	}
	for n, name := range RunEventType_name {
		ty := RunEventType(n)
		w, ok := want[ty]
		if !ok {
			t.Errorf("%s is not classified: add it here and to IsTerminal", name)
			continue
		}
		if ty.IsTerminal() != w {
			t.Errorf("%s.IsTerminal() = %v, want %v", name, ty.IsTerminal(), w)
		}
	}
	if RunEventType(99).IsTerminal() {
		t.Error("an unknown type is terminal")
	}
}
