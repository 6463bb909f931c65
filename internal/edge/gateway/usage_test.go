package gateway

import (
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/metrics"
	"github.com/iop-dev/iop/internal/edge/metrics/metricstest"
	"github.com/iop-dev/iop/internal/edge/nodes"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

func testMetrics() *metrics.Metrics { return metrics.New(nodes.New(nodes.Options{}), nil) }

// A request is counted by route, model, principal and outcome. The model
// is a label only once the scheduler took the request for it (a slot, or
// a refusal for that model): a name the client made up never makes a
// series.
func TestRequestsAreLabelledByAModelOnlyOnceItWasScheduled(t *testing.T) {
	m := testMetrics()
	alice := auth.Principal{Name: "alice"}
	record := func(model string, admitted bool, f *Failure) {
		x := NewExchange(httptest.NewRecorder(), httptest.NewRequest("POST", "/", nil), "openai_chat", m, nil)
		x.P, x.Model = alice, model
		if admitted {
			x.Begin(time.Minute)
			x.Admitted()
			defer x.End()
		}
		x.Record("test", "ok", f, false)
	}
	record("llama3.2", true, nil)
	record("made-up-name", false, ModelNotFound("made-up-name"))
	record("llama3.2", false, StartFailure(&sched.RefusalError{Reason: sched.ReasonQueueFull, Model: "llama3.2"}, nil, "llama3.2"))

	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"route", "openai_chat", "model", "llama3.2", "principal", "alice", "outcome", "ok"}, 1},
		{[]string{"model", "", "principal", "alice", "outcome", "model_not_found"}, 1},
		{[]string{"model", "llama3.2", "outcome", "queue_full"}, 1},
		{[]string{"model", "made-up-name"}, 0},
	} {
		if got := metricstest.Sum(t, m.Requests, c.labels...); got != c.want {
			t.Errorf("requests %q = %v, want %v", c.labels, got, c.want)
		}
	}
}

// The time to first token is observed by route and by the model the
// request was scheduled for.
func TestTimeToFirstTokenIsByRouteAndModel(t *testing.T) {
	m := testMetrics()
	x := NewExchange(httptest.NewRecorder(), httptest.NewRequest("POST", "/", nil), "ollama_chat", m, nil)
	x.Model = "qwen3"
	x.Begin(time.Minute)
	defer x.End()
	x.Admitted()
	x.FirstByte()
	if got := metricstest.Sum(t, m.TimeToFirstToken, "route", "ollama_chat", "model", "qwen3"); got != 1 {
		t.Errorf("time to first token observed %v times for ollama_chat, qwen3; want 1", got)
	}
}

// A run's tokens are its last usage report's (usage is cumulative),
// counted once whatever ends it, by model, principal and Node; the pace is
// observed only for an answer that completed, from its first output.
func TestUsageIsCountedOnceFromTheLastReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := testMetrics()
		g := &Gateway{metrics: m}
		text := &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: "a"}
		usage := func(p, c int64) *wirepb.RunEvent {
			return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_USAGE, Usage: &wirepb.Usage{PromptTokens: p, CompletionTokens: c}}
		}

		done := usageMeter{g: g, model: "llama3.2", principal: "alice"}
		time.Sleep(3 * time.Second) // prefill: not part of the pace
		done.see(text)
		done.see(usage(10, 1))
		time.Sleep(2 * time.Second)
		done.see(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, Usage: &wirepb.Usage{PromptTokens: 10, CompletionTokens: 41}})
		done.end("gpu-1", true)
		done.end("gpu-1", true) // once

		gone := usageMeter{g: g, model: "llama3.2", principal: "bob"}
		gone.see(text)
		gone.see(usage(5, 3))
		time.Sleep(time.Second)
		gone.end("gpu-2", false) // the client left: its tokens count, its pace does not

		silent := usageMeter{g: g, model: "llama3.2", principal: "carol"}
		silent.end("gpu-1", true) // nothing reported: nothing counted

		for _, c := range []struct {
			what      string
			got, want float64
		}{
			{"prompt", metricstest.Sum(t, m.PromptTokens, "model", "llama3.2", "principal", "alice", "node", "gpu-1"), 10},
			{"completion", metricstest.Sum(t, m.CompletionTokens, "model", "llama3.2", "principal", "alice", "node", "gpu-1"), 41},
			{"prompt, client gone", metricstest.Sum(t, m.PromptTokens, "principal", "bob", "node", "gpu-2"), 5},
			{"completion, client gone", metricstest.Sum(t, m.CompletionTokens, "principal", "bob", "node", "gpu-2"), 3},
			{"nothing reported", metricstest.Sum(t, m.PromptTokens, "principal", "carol"), 0},
			{"paces observed", metricstest.Sum(t, m.TokensPerSecond, "model", "llama3.2"), 1},
		} {
			if c.got != c.want {
				t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
			}
		}
		if got := paceSum(t, m); got != 20 { // 40 tokens after the first in 2 s
			t.Errorf("pace %v tokens/s, want 20", got)
		}
	})
}

// paceSum is the sum of the observed paces.
func paceSum(t *testing.T, m *metrics.Metrics) float64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() == "iop_edge_tokens_per_second" {
			for _, s := range f.GetMetric() {
				sum += s.GetHistogram().GetSampleSum()
			}
		}
	}
	return sum
}
