package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

// The command end to end with tiny workloads: it builds and starts the
// real daemons, measures every workload on both sides through both APIs
// (and workloads 1 and 2 through the floor, quicfloor's two processes),
// runs the scale workloads on their own stack, fills every figure and
// prints the tables, and leaves no process behind.
func TestBenchRunsEveryWorkloadThroughBothAPIs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds edged and noded and runs them: not with -short")
	}
	cfg := config{quick: true, apis: allAPIs, capacity: 8, tokens: 20, tokenDelay: 2 * time.Millisecond,
		singleReps: 3, singleGap: 100 * time.Millisecond, streams: 4, streamReps: 2, longTokens: 500, longReps: 1,
		prefill: 300 * time.Millisecond, goneTries: 2,
		scaleRuns: 40, scalePrefill: time.Second, scaleStreams: 20, scaleDuration: time.Second, scaleGap: 100 * time.Millisecond}
	var log bytes.Buffer
	res, err := run(t.Context(), cfg, &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if kids := childPIDs(os.Getpid()); len(kids) > 0 {
		t.Errorf("processes left running: %v", kids)
	}

	if len(res.APIs) != 3 {
		t.Fatalf("%d APIs measured, want 3 (ollama, openai, floor)", len(res.APIs))
	}
	for _, a := range res.APIs {
		floor := a.API == apiFloor.Key
		for name, f := range map[string]*pair[streamsFigures]{"single": a.Single, "concurrent": a.Concurrent} {
			for _, s := range []streamsFigures{f.Direct, f.IOP} {
				if s.Failed != 0 || s.Tokens != s.Answers*cfg.tokens || s.TTFBP50 <= 0 || s.TokensPerSec <= 0 ||
					s.RequestLegP50 <= 0 || s.ProviderAnswerP50 <= 0 {
					t.Errorf("%s %s: %+v", a.API, name, s)
				}
			}
		}
		// The single stream's client waits its gap between two answers:
		// the answers' own token delays and the gaps are the least it
		// can take (without the gaps, about 200 ms less).
		least := time.Duration(cfg.singleReps*cfg.tokens)*cfg.tokenDelay + time.Duration(cfg.singleReps-1)*cfg.singleGap
		if a.Single.IOP.Wall < least || a.Single.Direct.Wall < least {
			t.Errorf("%s: one stream's answers took %v and %v, less than their token delays and gaps, %v", a.API, a.Single.Direct.Wall, a.Single.IOP.Wall, least)
		}
		if a.Concurrent.IOP.Answers != cfg.streams*cfg.streamReps {
			t.Errorf("%s: %d concurrent answers, want %d", a.API, a.Concurrent.IOP.Answers, cfg.streams*cfg.streamReps)
		}
		if floor { // workloads 1 and 2 only, through its two processes
			if a.Long != nil || a.Prefill != nil || a.ClientGone != nil || len(a.CPU) != 2 || a.cpu(2).perToken() <= 0 {
				t.Errorf("floor: %+v", a)
			}
			if m := a.ConcurrentRSS; m == nil || !m.Reset || len(m.Processes) != 2 || m.Total <= 0 ||
				!strings.HasPrefix(m.Processes[0].Process, "quicfloor") {
				t.Errorf("floor peak RSS at workload 2: %+v", m)
			}
			continue
		}
		for _, l := range []longFigures{a.Long.Direct, a.Long.IOP} {
			if l.Tokens != cfg.longTokens || l.TokensPerSec <= 0 || l.MaxGap <= 0 {
				t.Errorf("%s long stream: %+v", a.API, l)
			}
		}
		if !a.Prefill.Direct.Done || !a.Prefill.IOP.Done || a.Prefill.IOP.TTFB < cfg.prefill {
			t.Errorf("%s prefill: %+v", a.API, a.Prefill)
		}
		if a.ClientGone.IOP.Tries != cfg.goneTries || a.ClientGone.IOP.P50 <= 0 {
			t.Errorf("%s client gone: %+v", a.API, a.ClientGone)
		}
		if len(a.CPU) != 3 || a.cpu(2).perToken() <= 0 {
			t.Errorf("%s cpu: %+v", a.API, a.CPU)
		}
		// The tunnel's workloads run before any normalized run, so its load
		// is a Node's that only relays: no plugin process (issue 25).
		wantProcs := 3 // edged, noded, the ollama plugin
		if a.API == apiOllama.Key {
			wantProcs = 2
		}
		if m := a.ConcurrentRSS; m == nil || !m.Reset || len(m.Processes) != wantProcs || m.Total <= 0 {
			t.Errorf("%s peak RSS at workload 2, want %d processes: %+v", a.API, wantProcs, m)
		}
	}
	if !res.Prefill.NodeKeptGeneration {
		t.Errorf("prefill: %+v", res.Prefill)
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

	s := res.Scale
	if s == nil || len(s.Runs) != 2 || len(s.Streams) != 2 {
		t.Fatalf("scale: %+v", s)
	}
	for _, f := range s.Runs {
		if f.Completed != cfg.scaleRuns || f.Failed != 0 || f.PeakInFlight != cfg.scaleRuns || f.RSS.Total <= 0 ||
			!f.Heartbeat.StayedReady || f.Heartbeat.Polls == 0 {
			t.Errorf("scale runs %s: %+v", f.API, f)
		}
	}
	for _, f := range s.Streams {
		if f.Complete != cfg.scaleStreams || f.TokensReceived != f.TokensExpected || f.TokensExpected != cfg.scaleStreams*10 ||
			f.CPU.Total <= 0 {
			t.Errorf("scale streams %s: %+v", f.API, f)
		}
	}

	// Per API: 1 stream, 64 streams ×6, long stream, prefill, client gone;
	// per API and scale workload: 8 ×3, 9 ×1.
	if want := 2*10 + 2*4; len(res.Targets) != want {
		t.Errorf("%d verdicts, want %d", len(res.Targets), want)
	}
	// Issue 25's, for the tunnel: 1 stream, and at 64 streams CPU and RSS.
	if want := 3; len(res.Targets25) != want {
		t.Errorf("%d verdicts of issue 25, want %d", len(res.Targets25), want)
	}
	var out bytes.Buffer
	res.print(&out)
	for _, want := range []string{"1 stream: TTFB p50", "CPU per relayed token", "Targets (issue 14)", "Targets (issue 25", "Peak RSS at 4 streams",
		"openai (normalized): POST /v1/chat/completions", "ollama (tunnel): POST /api/chat", "8: 40 runs at once", "9: 20 streams at once",
		"floor (bare quic-go relay): POST /api/chat through quicfloor", "The tunnel beside the transport's floor", "quicfloor summed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := json.Marshal(res); err != nil {
		t.Error(err)
	}
	t.Logf("\n%s", out.String())
}

// The OpenAI parser counts a token per word of the content deltas, ends at
// [DONE] after a finish_reason, skips keep-alives and the role chunk, and
// fails on an error event or a [DONE] with no finish_reason.
func TestSSEParser(t *testing.T) {
	cases := []struct {
		name   string
		body   string
		tokens int
		text   string
		err    string
	}{
		{"one delta per token", ": keep-alive\n\n" +
			`data: {"choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n" +
			`data: {"choices":[{"delta":{"content":"alpha"}}]}` + "\n\n" +
			`data: {"choices":[{"delta":{"content":" bravo"}}]}` + "\n\n" +
			`data: {"choices":[{"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n", 2, "alpha bravo", ""},
		{"coalesced deltas", `data: {"choices":[{"delta":{"content":"alpha bravo charlie"}}]}` + "\n\n" +
			`data: {"choices":[{"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n", 3, "alpha bravo charlie", ""},
		{"error event", `data: {"choices":[{"delta":{"content":"alpha"}}]}` + "\n\n" +
			`data: {"error":{"message":"boom"}}` + "\n\ndata: [DONE]\n\n", 1, "", "error event"},
		{"no finish reason", `data: {"choices":[{"delta":{"content":"alpha"}}]}` + "\n\ndata: [DONE]\n\n", 1, "", "without a chunk carrying a finish_reason"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			s := side{name: "t", api: apiOpenAI, base: srv.URL}
			r, err := stream(t.Context(), srv.Client(), s, "m", "p", true)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !r.done || r.tokens != tc.tokens || string(r.text) != tc.text || r.ttfb <= 0 {
				t.Fatalf("%+v %v", r, err)
			}
		})
	}
}
