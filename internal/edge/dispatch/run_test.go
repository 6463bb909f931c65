package dispatch

import (
	"testing"

	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The hot path: a token of a run costs no allocation on the status page's
// side; its phase, tokens and usage show as they come.
func TestSeeingATokenAllocatesNothing(t *testing.T) {
	tr := inflight.New(inflight.Options{})
	r := &Run{work: work{live: tr.Start(inflight.Work{Kind: inflight.Run, ID: "r"})}}
	ev := &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: "tok"}
	r.see(ev)
	if a := testing.AllocsPerRun(1000, func() { r.see(ev) }); a != 0 {
		t.Errorf("a token allocates %v times", a)
	}
	v := tr.Snapshot().Live[0]
	if v.Phase != inflight.Streaming || v.Tokens != 1002 || v.TTFTMillis == nil {
		t.Errorf("after 1002 tokens: %+v, want streaming with 1002 tokens and a time to first token", v)
	}
	r.see(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, Usage: &wirepb.Usage{PromptTokens: 3, CompletionTokens: 1002}})
	if v := tr.Snapshot().Live[0]; v.CompletionTokens != 1002 || v.PromptTokens != 3 {
		t.Errorf("after the terminal: %+v, want its usage (the front end ends the entry)", v)
	}
}
