package ollama

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/sdk"
)

// P2, issue 21: the run's reasoning effort reaches Ollama's think on both
// /api/chat and /api/generate: none as false, a level as Ollama's nearest
// ("max" as "high", which every Ollama with levels takes), Think alone as
// true or false; the normalized options win over Extra's think, and
// without them Extra's think passes as the client wrote it.
func TestReasoningEffortBecomesThink(t *testing.T) {
	on, off := true, false
	tests := []struct {
		name   string
		effort string
		think  *bool
		extra  string
		want   string // the think field sent, "" for none
	}{
		{"nothing", "", nil, "", ""},
		{"none", sdk.EffortNone, &off, "", `false`},
		{"minimal", sdk.EffortMinimal, &on, "", `"low"`},
		{"low", sdk.EffortLow, &on, "", `"low"`},
		{"medium", sdk.EffortMedium, &on, "", `"medium"`},
		{"high", sdk.EffortHigh, &on, "", `"high"`},
		{"max", sdk.EffortMax, &on, "", `"high"`},
		{"effort without think", sdk.EffortLow, nil, "", `"low"`},
		{"think on alone", "", &on, "", `true`},
		{"think off alone", "", &off, "", `false`},
		{"effort over extra's think", sdk.EffortMedium, &on, `{"think":"low"}`, `"medium"`},
		{"think over extra's think", "", &off, `{"think":"high"}`, `false`},
		{"extra's think alone", "", nil, `{"think":"high"}`, `"high"`},
	}
	srv := newScripted(t, func(int, string) (int, string) { return 200, answerLines("stop", "ok") })
	a := newAdapter(t, srv.URL, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := sdk.Options{ReasoningEffort: tt.effort, Think: tt.think, Extra: json.RawMessage(tt.extra)}
			chat := userRun("m")
			chat.Options = o
			if _, err := a.Execute(ctxTimeout(t, 5*time.Second), chat, &sink{}); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Complete(ctxTimeout(t, 5*time.Second), &sdk.Request{Target: "m", Prompt: "p", Options: o}, &sink{}); err != nil {
				t.Fatal(err)
			}
			bodies := srv.sent()
			for _, body := range bodies[len(bodies)-2:] {
				var fields map[string]json.RawMessage
				if err := json.Unmarshal([]byte(body), &fields); err != nil {
					t.Fatal(err)
				}
				if got := string(fields["think"]); got != tt.want {
					t.Errorf("think %s, want %s in %s", got, tt.want, body)
				}
			}
		})
	}

	req := userRun("m")
	req.Options.ReasoningEffort = "extreme"
	if _, err := a.Execute(ctxTimeout(t, time.Second), req, &sink{}); !errors.Is(err, sdk.ErrInvalidRequest) {
		t.Errorf("an unknown effort: %v, want invalid_request", err)
	}
}

// Issue 21: a model that cannot think refuses think (400 "does not support
// thinking"). When the adapter mapped think from the run's reasoning
// options, the run goes again without think and is answered; a think the
// client wrote in Ollama's vocabulary (Extra) is refused as Ollama refuses
// it. Both endpoints.
func TestThinkingOnAModelThatCannotThinkIsRelaxed(t *testing.T) {
	const refusal = `{"error":"\"llama3.2\" does not support thinking"}`
	srv := newScripted(t, func(_ int, body string) (int, string) {
		if strings.Contains(body, `"think":`) && !strings.Contains(body, `"think":false`) {
			return 400, refusal
		}
		return 200, answerLines("stop", "plain answer")
	})
	a := newAdapter(t, srv.URL, nil)
	on := true
	tests := []struct {
		name     string
		options  sdk.Options
		complete bool
		wantErr  bool
		requests int
	}{
		{"effort, chat", sdk.Options{ReasoningEffort: sdk.EffortHigh, Think: &on}, false, false, 2},
		{"think, chat", sdk.Options{Think: &on}, false, false, 2},
		{"effort, generate", sdk.Options{ReasoningEffort: sdk.EffortLow}, true, false, 2},
		{"extra's think, chat", sdk.Options{Extra: json.RawMessage(`{"think":true}`)}, false, true, 1},
		{"effort none is not refused", sdk.Options{ReasoningEffort: sdk.EffortNone}, false, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(srv.sent())
			var out sink
			var err error
			if tt.complete {
				_, err = a.Complete(ctxTimeout(t, 5*time.Second), &sdk.Request{Target: "llama3.2", Prompt: "p", Options: tt.options}, &out)
			} else {
				req := userRun("llama3.2")
				req.Options = tt.options
				_, err = a.Execute(ctxTimeout(t, 5*time.Second), req, &out)
			}
			if got := len(srv.sent()) - before; got != tt.requests {
				t.Errorf("%d requests, want %d", got, tt.requests)
			}
			if tt.wantErr {
				if !errors.Is(err, sdk.ErrInvalidRequest) || !strings.Contains(err.Error(), "does not support thinking") {
					t.Errorf("err %v, want Ollama's refusal", err)
				}
				return
			}
			if err != nil || out.text(sdk.TextDelta) != "plain answer" {
				t.Fatalf("%v, text %q", err, out.text(sdk.TextDelta))
			}
			if last := srv.sent()[len(srv.sent())-1]; tt.requests == 2 && strings.Contains(last, `"think"`) {
				t.Errorf("the second request still thinks: %s", last)
			}
		})
	}
}
