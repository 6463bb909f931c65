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

// Issue 21: Ollama refuses a think a model cannot follow: a level on a
// model without levels (400 `think value "high" is not supported for this
// model`, Ollama 0.11 to 0.17.6) and any thinking on a model that cannot
// think (400 "does not support thinking"). When the adapter mapped think
// from the run's reasoning options, the run steps down (level, then true,
// then no think) and is answered; a think the client wrote in Ollama's
// vocabulary (Extra) is refused as Ollama refuses it. Both endpoints; the
// thinks sent are asserted in order.
func TestThinkingAModelCannotFollowStepsDown(t *testing.T) {
	// thinks is a model that thinks without levels; plain cannot think.
	srv := newScripted(t, func(_ int, body string) (int, string) {
		var req struct {
			Model string          `json:"model"`
			Think json.RawMessage `json:"think"`
		}
		json.Unmarshal([]byte(body), &req)
		switch think := string(req.Think); {
		case strings.HasPrefix(think, `"`):
			return 400, `{"error":"think value ` + strings.ReplaceAll(think, `"`, `\"`) + ` is not supported for this model"}`
		case req.Model == "plain" && think == "true":
			return 400, `{"error":"\"plain\" does not support thinking"}`
		}
		return 200, answerLines("stop", "plain answer")
	})
	a := newAdapter(t, srv.URL, nil)
	on := true
	tests := []struct {
		name     string
		model    string
		options  sdk.Options
		complete bool
		thinks   []string // the think of each request sent
		refused  string   // the run's error, "" for none
	}{
		{"a level on a model without levels", "thinks", sdk.Options{ReasoningEffort: sdk.EffortHigh, Think: &on}, false, []string{`"high"`, `true`}, ""},
		{"a level on a model that cannot think", "plain", sdk.Options{ReasoningEffort: sdk.EffortLow}, false, []string{`"low"`, `true`, ``}, ""},
		{"think on a model that cannot think", "plain", sdk.Options{Think: &on}, false, []string{`true`, ``}, ""},
		{"a level, generate", "plain", sdk.Options{ReasoningEffort: sdk.EffortMedium}, true, []string{`"medium"`, `true`, ``}, ""},
		{"effort none is not refused", "plain", sdk.Options{ReasoningEffort: sdk.EffortNone}, false, []string{`false`}, ""},
		{"extra's level is the client's", "thinks", sdk.Options{Extra: json.RawMessage(`{"think":"high"}`)}, false, []string{`"high"`}, "is not supported for this model"},
		{"extra's think is the client's", "plain", sdk.Options{Extra: json.RawMessage(`{"think":true}`)}, false, []string{`true`}, "does not support thinking"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(srv.sent())
			var out sink
			var err error
			if tt.complete {
				_, err = a.Complete(ctxTimeout(t, 5*time.Second), &sdk.Request{Target: tt.model, Prompt: "p", Options: tt.options}, &out)
			} else {
				req := userRun(tt.model)
				req.Options = tt.options
				_, err = a.Execute(ctxTimeout(t, 5*time.Second), req, &out)
			}
			var thinks []string
			for _, body := range srv.sent()[before:] {
				var fields map[string]json.RawMessage
				json.Unmarshal([]byte(body), &fields)
				thinks = append(thinks, string(fields["think"]))
			}
			if strings.Join(thinks, " ") != strings.Join(tt.thinks, " ") {
				t.Errorf("thinks sent %q, want %q", thinks, tt.thinks)
			}
			if tt.refused != "" {
				if !errors.Is(err, sdk.ErrInvalidRequest) || !strings.Contains(err.Error(), tt.refused) {
					t.Errorf("err %v, want Ollama's refusal", err)
				}
				return
			}
			if err != nil || out.text(sdk.TextDelta) != "plain answer" {
				t.Fatalf("%v, text %q", err, out.text(sdk.TextDelta))
			}
		})
	}
}
