package dispatch

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/edgemetrics/metricstest"
	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

func testMetrics() *edgemetrics.Metrics { return edgemetrics.New(fleet.New(fleet.Options{}), nil) }

// A run's tokens are its last usage report's (usage is cumulative),
// counted once whatever ends it, by model, principal and Node; the pace is
// observed only for an answer that completed, from its first output.
func TestUsageIsCountedOnceFromTheLastReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := testMetrics()
		d := &Dispatcher{metrics: m}
		text := &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: "a"}
		usage := func(p, c int64) *wirepb.RunEvent {
			return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_USAGE, Usage: &wirepb.Usage{PromptTokens: p, CompletionTokens: c}}
		}

		done := usageMeter{d: d, model: "llama3.2", principal: "alice"}
		time.Sleep(3 * time.Second) // prefill: not part of the pace
		done.see(text)
		done.see(usage(10, 1))
		time.Sleep(2 * time.Second)
		done.see(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, Usage: &wirepb.Usage{PromptTokens: 10, CompletionTokens: 41}})
		done.end("gpu-1", true)
		done.end("gpu-1", true) // once

		gone := usageMeter{d: d, model: "llama3.2", principal: "bob"}
		gone.see(text)
		gone.see(usage(5, 3))
		time.Sleep(time.Second)
		gone.end("gpu-2", false) // the client left: its tokens count, its pace does not

		silent := usageMeter{d: d, model: "llama3.2", principal: "carol"}
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
func paceSum(t *testing.T, m *edgemetrics.Metrics) float64 {
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
