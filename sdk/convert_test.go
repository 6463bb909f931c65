package sdk

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The shared kind table covers every Kind, both ways, and maps each to
// the wire kind of the same name (unavailable is provider_unavailable).
func TestKindTableCoversEveryKind(t *testing.T) {
	for k := range kindNames {
		w := pluginpb.KindToWire(int(k))
		name := "FAILURE_KIND_" + strings.ToUpper(k.String())
		if k == KindUnavailable {
			name = "FAILURE_KIND_PROVIDER_UNAVAILABLE"
		}
		if w.String() != name {
			t.Errorf("%v maps to %v, want %s", k, w, name)
		}
		if back := Kind(pluginpb.KindFromWire(w)); back != k {
			t.Errorf("%v comes back as %v", k, back)
		}
	}
	for _, w := range []wirepb.FailureKind{
		wirepb.FailureKind_FAILURE_KIND_UNSPECIFIED, wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED,
		wirepb.FailureKind_FAILURE_KIND_LEASE_REJECTED, wirepb.FailureKind_FAILURE_KIND_PROTOCOL,
	} {
		if k := Kind(pluginpb.KindFromWire(w)); k != KindInternal {
			t.Errorf("Node-only kind %v comes back as %v, want internal", w, k)
		}
	}
}

func TestFailureToWireKeepsTheErrorsParts(t *testing.T) {
	err := &Error{Kind: KindRateLimited, Message: "slow down", Retryable: true, UpstreamStatus: 429}
	f := failureToWire(err)
	if f.GetKind() != wirepb.FailureKind_FAILURE_KIND_RATE_LIMITED || f.GetMessage() != "slow down" || !f.GetRetryable() || f.GetUpstreamStatus() != 429 {
		t.Errorf("failure %v", f)
	}
	if f := failureToWire(errors.New("plain")); f.GetKind() != wirepb.FailureKind_FAILURE_KIND_INTERNAL || f.GetMessage() != "plain" {
		t.Errorf("plain error as %v", f)
	}
}

// Events are validated: never a terminal, never a kind the wire does not
// know, and only the payload their kind carries.
func TestEventToWireRejectsInvalidEvents(t *testing.T) {
	cases := []struct {
		name string
		ev   Event
		ok   bool
	}{
		{"text", Event{Kind: TextDelta, Text: "hi"}, true},
		{"empty text", Event{Kind: TextDelta}, true},
		{"reasoning", Event{Kind: ReasoningDelta, Text: "hm"}, true},
		{"tool call", Event{Kind: ToolCallDelta, ToolCall: &ToolCall{Name: "f"}}, true},
		{"usage", Event{Kind: UsageReport, Usage: &Usage{PromptTokens: 1}}, true},
		{"kind 0", Event{}, false},
		{"terminal-like kind", Event{Kind: EventKind(10)}, false},
		{"negative kind", Event{Kind: -1}, false},
		{"tool call without call", Event{Kind: ToolCallDelta}, false},
		{"negative tool index", Event{Kind: ToolCallDelta, ToolCall: &ToolCall{Index: -1}}, false},
		{"huge tool index", Event{Kind: ToolCallDelta, ToolCall: &ToolCall{Index: math.MaxInt32 + 1}}, false},
		{"usage without usage", Event{Kind: UsageReport}, false},
		{"text with usage", Event{Kind: TextDelta, Text: "x", Usage: &Usage{}}, false},
		{"usage with text", Event{Kind: UsageReport, Usage: &Usage{}, Text: "x"}, false},
	}
	for _, c := range cases {
		_, err := eventToWire(c.ev)
		if (err == nil) != c.ok {
			t.Errorf("%s: err %v", c.name, err)
		}
		if err != nil && (!errors.Is(err, ErrInternal) || !errors.Is(err, errInvalidEvent)) {
			t.Errorf("%s: %v is not an internal invalid-event error", c.name, err)
		}
	}
}

func TestRequestFromWireCarriesEveryField(t *testing.T) {
	temp, top, think := 0.5, 0.9, true
	var maxTok, seed int64 = 100, 7
	deadline := time.UnixMilli(1_700_000_000_000)
	r := &wirepb.RunRequest{
		RunId: "r", SessionId: "s", Target: "m",
		Messages: []*wirepb.ChatMessage{{Role: "assistant", Content: "c", Reasoning: "why",
			ToolCalls:  []*wirepb.ToolCall{{Index: 1, Id: "id", Name: "f", ArgumentsJson: []byte(`{}`)}},
			ToolCallId: "tc", Name: "n", Images: [][]byte{{1, 2}}}},
		Tools: []*wirepb.Tool{{Name: "f", Description: "d", ParametersJson: []byte(`{"type":"object"}`)}},
		Options: &wirepb.RunOptions{Temperature: &temp, TopP: &top, MaxTokens: &maxTok, Stop: []string{"x"},
			Seed: &seed, Format: []byte(`"json"`), ExtraJson: []byte(`{"num_ctx":8}`), Think: &think,
			ToolChoice: "function:f"},
		DeadlineUnixMs: deadline.UnixMilli(), ResponseStallTimeoutMs: 1500,
		Completion: &wirepb.CompletionInput{Prompt: "def f(", Suffix: "return x"},
	}
	req := requestFromWire(r, &pluginpb.Credential{Kind: "bearer", Secret: "s3"})
	if req.Prompt != "def f(" || req.Suffix != "return x" {
		t.Errorf("completion %q %q", req.Prompt, req.Suffix)
	}
	m := req.Messages[0]
	if req.RunID != "r" || req.SessionID != "s" || req.Target != "m" || !req.Deadline.Equal(deadline) ||
		req.StallTimeout != 1500*time.Millisecond || req.Credential.Secret != "s3" || req.Credential.Kind != "bearer" {
		t.Errorf("request %+v", req)
	}
	if m.Role != "assistant" || m.Content != "c" || m.Reasoning != "why" || m.ToolCallID != "tc" || m.Name != "n" ||
		len(m.Images) != 1 || m.ToolCalls[0] != (ToolCall{Index: 1, ID: "id", Name: "f", Arguments: "{}"}) {
		t.Errorf("message %+v", m)
	}
	if req.Tools[0].Name != "f" || string(req.Tools[0].Parameters) != `{"type":"object"}` {
		t.Errorf("tools %+v", req.Tools)
	}
	o := req.Options
	if *o.Temperature != temp || *o.TopP != top || *o.MaxTokens != 100 || o.Stop[0] != "x" || *o.Seed != 7 ||
		string(o.Format) != `"json"` || string(o.Extra) != `{"num_ctx":8}` || !*o.Think ||
		o.ToolChoice != ToolChoiceFunction("f") {
		t.Errorf("options %+v", o)
	}

	// R4: wire value 0 means 300000 ms; no deadline stays zero.
	bare := requestFromWire(&wirepb.RunRequest{}, nil)
	if bare.StallTimeout != 300*time.Second || !bare.Deadline.IsZero() || bare.Credential != nil || bare.Options.Temperature != nil {
		t.Errorf("bare request %+v", bare)
	}
}

func TestTunnelRequestFromWireCarriesEveryField(t *testing.T) {
	r := &wirepb.TunnelRequest{TunnelId: "t", SessionId: "s", Target: "m", Method: "POST", Path: "/api/chat?x=1",
		Headers: []*wirepb.Header{{Name: "b", Value: "2"}, {Name: "A", Value: "1"}, {Name: "B", Value: "3"}}}
	req := tunnelRequestFromWire(r, &pluginpb.Credential{Kind: "bearer", Secret: "s3"})
	if req.TunnelID != "t" || req.SessionID != "s" || req.Target != "m" || req.Method != "POST" || req.Path != "/api/chat?x=1" ||
		req.Credential.Secret != "s3" || req.Header.Get("A") != "1" || strings.Join(req.Header.Values("B"), ",") != "2,3" {
		t.Errorf("request %+v", req)
	}
	if bare := tunnelRequestFromWire(&wirepb.TunnelRequest{}, nil); bare.Header == nil || bare.Credential != nil {
		t.Errorf("bare request %+v", bare)
	}
}

// The shared health table covers every HealthStatus, both ways.
func TestHealthTableCoversEveryStatus(t *testing.T) {
	for _, h := range []HealthStatus{HealthUnknown, HealthAvailable, HealthUnavailable} {
		w := pluginpb.HealthToWire(int(h))
		if name := "HEALTH_STATUS_" + strings.ToUpper(h.String()); w.String() != name {
			t.Errorf("%v maps to %v, want %s", h, w, name)
		}
		if back := HealthStatus(pluginpb.HealthFromWire(w)); back != h {
			t.Errorf("%v comes back as %v", h, back)
		}
	}
	if w := pluginpb.HealthToWire(42); w != pluginpb.HealthStatus_HEALTH_STATUS_UNKNOWN {
		t.Errorf("an unknown status maps to %v, want unknown", w)
	}
}

func TestEmbedRequestFromWireCarriesEveryField(t *testing.T) {
	deadline := time.UnixMilli(1_700_000_000_000)
	r := &wirepb.EmbedRequest{EmbedId: "e", SessionId: "s", Target: "m", Inputs: []string{"a", "b"}, Dimensions: 256,
		ExtraJson: []byte(`{"user":"u"}`), DeadlineUnixMs: deadline.UnixMilli(), ResponseStallTimeoutMs: 1500}
	req := embedRequestFromWire(r, &pluginpb.Credential{Kind: "bearer", Secret: "s3"})
	if req.EmbedID != "e" || req.SessionID != "s" || req.Target != "m" || len(req.Inputs) != 2 || req.Dimensions != 256 ||
		string(req.Extra) != `{"user":"u"}` || !req.Deadline.Equal(deadline) || req.StallTimeout != 1500*time.Millisecond ||
		req.Credential.Secret != "s3" {
		t.Errorf("request %+v", req)
	}
	if bare := embedRequestFromWire(&wirepb.EmbedRequest{}, nil); bare.StallTimeout != 300*time.Second || !bare.Deadline.IsZero() {
		t.Errorf("bare request %+v", bare)
	}
}
