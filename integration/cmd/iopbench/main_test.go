package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// The command end to end with tiny workloads: it builds and starts the
// real daemons, measures every workload on both sides, fills every figure
// and prints the tables, and leaves no process behind.
func TestBenchRunsEveryWorkloadOnBothSides(t *testing.T) {
	if testing.Short() {
		t.Skip("builds edged and noded and runs them: not with -short")
	}
	cfg := config{quick: true, capacity: 8, tokens: 20, tokenDelay: 2 * time.Millisecond,
		singleReps: 3, streams: 4, streamReps: 2, longTokens: 500, longReps: 1,
		prefill: 300 * time.Millisecond, goneTries: 2}
	var log bytes.Buffer
	res, err := run(t.Context(), cfg, &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if kids := childPIDs(os.Getpid()); len(kids) > 0 {
		t.Errorf("processes left running: %v", kids)
	}

	for name, f := range map[string]pair[streamsFigures]{"single": res.Single, "concurrent": res.Concurrent} {
		for _, s := range []streamsFigures{f.Direct, f.IOP} {
			if s.Failed != 0 || s.Tokens != s.Answers*cfg.tokens || s.TTFBP50 <= 0 || s.TokensPerSec <= 0 ||
				s.RequestLegP50 <= 0 || s.ProviderAnswerP50 <= 0 {
				t.Errorf("%s: %+v", name, s)
			}
		}
	}
	if res.Concurrent.IOP.Answers != cfg.streams*cfg.streamReps {
		t.Errorf("%d concurrent answers, want %d", res.Concurrent.IOP.Answers, cfg.streams*cfg.streamReps)
	}
	for _, l := range []longFigures{res.Long.Direct, res.Long.IOP} {
		if l.Tokens != cfg.longTokens || l.TokensPerSec <= 0 || l.MaxGap <= 0 {
			t.Errorf("long stream: %+v", l)
		}
	}
	if !res.Prefill.Direct.Done || !res.Prefill.IOP.Done || res.Prefill.IOP.TTFB < cfg.prefill || !res.Prefill.NodeKeptGeneration {
		t.Errorf("prefill: %+v", res.Prefill)
	}
	if res.ClientGone.IOP.Tries != cfg.goneTries || res.ClientGone.IOP.P50 <= 0 {
		t.Errorf("client gone: %+v", res.ClientGone)
	}
	if len(res.CPU.Workloads) != 3 || res.CPU.PerToken <= 0 {
		t.Errorf("cpu: %+v", res.CPU)
	}
	procs := map[string]bool{}
	for _, m := range res.Memory {
		procs[strings.Fields(m.Process)[0]] = m.PeakRSS > 0
	}
	for _, p := range []string{"edged", "noded", "plugin", "iopbench"} {
		if !procs[p] {
			t.Errorf("no peak memory for %s: %+v", p, res.Memory)
		}
	}
	if len(res.Targets) != 9 {
		t.Errorf("%d verdicts, want 9", len(res.Targets))
	}

	var out bytes.Buffer
	res.print(&out)
	for _, want := range []string{"1 stream: TTFB p50", "CPU per relayed token", "Targets (issue 4)", "Peak memory"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := json.Marshal(res); err != nil {
		t.Error(err)
	}
	t.Logf("\n%s", out.String())
}
