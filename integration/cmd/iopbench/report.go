package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// results is everything one run measured; it is also the -out JSON.
// Durations are in nanoseconds.
type results struct {
	Quick     bool       `json:"quick"`
	CPUs      int        `json:"cpus"`
	GoVersion string     `json:"go_version"`
	Config    configJSON `json:"config"`

	Single     pair[streamsFigures] `json:"single_stream"`
	Concurrent pair[streamsFigures] `json:"concurrent_streams"`
	Long       pair[longFigures]    `json:"long_stream"`
	Prefill    struct {
		Duration           time.Duration  `json:"prefill_ns"`
		Direct             prefillFigures `json:"direct"`
		IOP                prefillFigures `json:"iop"`
		NodeKeptGeneration bool           `json:"node_kept_ready_generation"`
	} `json:"prefill"`
	CPU struct {
		Workloads []cpuWorkload `json:"workloads"`
		PerToken  time.Duration `json:"per_token_ns"` // workloads 1–3 together
	} `json:"cpu"`
	Memory     []memFigure       `json:"peak_memory"`
	ClientGone pair[goneFigures] `json:"client_gone"`
	Targets    []verdict         `json:"targets"`
}

// pair is one workload's figures on both sides.
type pair[T any] struct {
	Direct T `json:"direct"`
	IOP    T `json:"iop"`
}

type configJSON struct {
	Capacity   int           `json:"capacity"`
	Tokens     int           `json:"tokens"`
	TokenDelay time.Duration `json:"token_delay_ns"`
	SingleReps int           `json:"single_reps"`
	Streams    int           `json:"streams"`
	StreamReps int           `json:"stream_reps"`
	LongTokens int           `json:"long_tokens"`
	LongReps   int           `json:"long_reps"`
	GoneTries  int           `json:"gone_tries"`
}

func (c config) export() configJSON {
	return configJSON{c.capacity, c.tokens, c.tokenDelay, c.singleReps, c.streams, c.streamReps, c.longTokens, c.longReps, c.goneTries}
}

// cpuWorkload is the CPU the IOP processes used during the iop half of one
// workload.
type cpuWorkload struct {
	Workload  int                      `json:"workload"`
	Tokens    int                      `json:"tokens"`
	Total     time.Duration            `json:"total_ns"`
	ByProcess map[string]time.Duration `json:"by_process_ns"`
}

type memFigure struct {
	Process string `json:"process"`
	PeakRSS int64  `json:"peak_rss_bytes"`
}

// verdict is one target of issue 4 against what was measured.
type verdict struct {
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
	Detail   string `json:"detail"` // by how much it was met or missed
}

// evaluate computes the CPU per token and the verdicts.
func (r *results) evaluate() {
	var cpu time.Duration
	tokens := 0
	for _, w := range r.CPU.Workloads {
		cpu += w.Total
		tokens += w.Tokens
	}
	if tokens > 0 {
		r.CPU.PerToken = cpu / time.Duration(tokens)
	}
	n := fmt.Sprintf("%d streams", r.Config.Streams)
	r.Targets = []verdict{
		atMost("1 stream: TTFB added, p50 ≤ 0.5 ms", r.Single.IOP.TTFBP50-r.Single.Direct.TTFBP50, 500*time.Microsecond),
		atMost(n+": TTFB added, p50 ≤ 1 ms", r.Concurrent.IOP.TTFBP50-r.Concurrent.Direct.TTFBP50, time.Millisecond),
		atMost(n+": TTFB added, p99 ≤ 3 ms", r.Concurrent.IOP.TTFBP99-r.Concurrent.Direct.TTFBP99, 3*time.Millisecond),
		atLeastRatio(n+": tokens/s ≥ 0.99 of direct", r.Concurrent.IOP.TokensPerSec, r.Concurrent.Direct.TokensPerSec, 0.99),
		{
			Target:   fmt.Sprintf("%s: no refusal below capacity %d", n, r.Config.Capacity),
			Measured: fmt.Sprintf("%d of %d answers failed", r.Concurrent.IOP.Failed, r.Concurrent.IOP.Answers),
			Met:      r.Concurrent.IOP.Failed == 0 && r.Concurrent.IOP.Answers > 0,
			Detail:   r.Concurrent.IOP.FirstFailure,
		},
		atLeastRatio("long stream: ≥ the provider's own rate", r.Long.IOP.TokensPerSec, r.Long.Direct.TokensPerSec, 1),
		{
			Target:   "long prefill: normal terminal, Node stays ready",
			Measured: fmt.Sprintf("terminal: %s; node kept its ready generation: %v", doneWord(r.Prefill.IOP.Done), r.Prefill.NodeKeptGeneration),
			Met:      r.Prefill.IOP.Done && r.Prefill.NodeKeptGeneration,
		},
		atMost("CPU per relayed token ≤ 40 µs", r.CPU.PerToken, 40*time.Microsecond),
		atMost("client gone → provider ≤ 10 ms (p50)", r.ClientGone.IOP.P50, 10*time.Millisecond),
	}
}

func doneWord(done bool) string {
	if done {
		return "done"
	}
	return "missing"
}

func atMost(target string, got, limit time.Duration) verdict {
	unit := ms
	if limit < 100*time.Microsecond {
		unit = us
	}
	v := verdict{Target: target, Measured: unit(got), Met: got <= limit}
	if v.Met {
		v.Detail = unit(limit-got) + " to spare"
	} else {
		v.Detail = fmt.Sprintf("missed by %s (%.1f× the target)", unit(got-limit), float64(got)/float64(limit))
	}
	return v
}

func atLeastRatio(target string, iop, direct, min float64) verdict {
	ratio := 0.0
	if direct > 0 {
		ratio = iop / direct
	}
	v := verdict{Target: target, Measured: fmt.Sprintf("%.3f of direct", ratio), Met: ratio >= min}
	if v.Met {
		v.Detail = fmt.Sprintf("%.3f to spare", ratio-min)
	} else {
		v.Detail = fmt.Sprintf("missed by %.3f (%.0f tokens/s short)", min-ratio, min*direct-iop)
	}
	return v
}

// print writes the tables: the figures side by side, the targets, the CPU
// by process and workload, and peak memory.
func (r *results) print(w io.Writer) {
	run := "full run"
	if r.Quick {
		run = "quick run (-quick)"
	}
	fmt.Fprintf(w, "IOP benchmark: %s, %d CPUs, %s\n", run, r.CPUs, r.GoVersion)
	fmt.Fprintf(w, "direct: POST /api/chat to the fake Ollama; iop: the same to the Edge (Edge → QUIC → Node → plugin → fake)\n\n")

	t := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(t, "\tdirect\tiop\tadded\tiop/direct\t")
	durRow := func(name string, d, i time.Duration) {
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%.2f\t\n", name, ms(d), ms(i), signed(i-d), ratio(float64(i), float64(d)))
	}
	rateRow := func(name string, d, i float64) {
		fmt.Fprintf(t, "%s\t%.0f\t%.0f\t%+.0f\t%.3f\t\n", name, d, i, i-d, ratio(i, d))
	}
	n, c := r.Config.Streams, r.Concurrent
	durRow("1 stream: TTFB p50", r.Single.Direct.TTFBP50, r.Single.IOP.TTFBP50)
	durRow("1 stream: TTFB p99", r.Single.Direct.TTFBP99, r.Single.IOP.TTFBP99)
	durRow("1 stream: request leg of TTFB, p50", r.Single.Direct.RequestLegP50, r.Single.IOP.RequestLegP50)
	rateRow("1 stream: tokens/s", r.Single.Direct.TokensPerSec, r.Single.IOP.TokensPerSec)
	durRow("1 stream: provider's answer time, p50", r.Single.Direct.ProviderAnswerP50, r.Single.IOP.ProviderAnswerP50)
	durRow(fmt.Sprintf("%d streams: TTFB p50", n), c.Direct.TTFBP50, c.IOP.TTFBP50)
	durRow(fmt.Sprintf("%d streams: TTFB p99", n), c.Direct.TTFBP99, c.IOP.TTFBP99)
	durRow(fmt.Sprintf("%d streams: request leg of TTFB, p50", n), c.Direct.RequestLegP50, c.IOP.RequestLegP50)
	rateRow(fmt.Sprintf("%d streams: tokens/s", n), c.Direct.TokensPerSec, c.IOP.TokensPerSec)
	durRow(fmt.Sprintf("%d streams: provider's answer time, p50", n), c.Direct.ProviderAnswerP50, c.IOP.ProviderAnswerP50)
	fmt.Fprintf(t, "%d streams: failed answers\t%d/%d\t%d/%d\t\t\t\n", n, c.Direct.Failed, c.Direct.Answers, c.IOP.Failed, c.IOP.Answers)
	rateRow(fmt.Sprintf("long stream (%d tokens): tokens/s", r.Config.LongTokens), r.Long.Direct.TokensPerSec, r.Long.IOP.TokensPerSec)
	durRow("long stream: largest gap between lines", r.Long.Direct.MaxGap, r.Long.IOP.MaxGap)
	durRow(fmt.Sprintf("prefill %v: TTFB", r.Prefill.Duration), r.Prefill.Direct.TTFB, r.Prefill.IOP.TTFB)
	fmt.Fprintf(t, "prefill: terminal\t%s\t%s\t\t\t\n", doneWord(r.Prefill.Direct.Done), doneWord(r.Prefill.IOP.Done))
	fmt.Fprintf(t, "CPU per relayed token (all IOP processes)\t\t%s\t\t\t\n", us(r.CPU.PerToken))
	durRow("client gone → provider sees it, p50", r.ClientGone.Direct.P50, r.ClientGone.IOP.P50)
	durRow("client gone → provider sees it, max", r.ClientGone.Direct.Max, r.ClientGone.IOP.Max)
	t.Flush()

	fmt.Fprintln(w, "\nTargets (issue 4):")
	t = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, v := range r.Targets {
		word := "MET"
		if !v.Met {
			word = "MISSED"
		}
		detail := v.Detail
		if len(detail) > 100 {
			detail = detail[:100] + "…"
		}
		fmt.Fprintf(t, "  %s\t%s\t%s\t%s\n", v.Target, v.Measured, word, detail)
	}
	t.Flush()

	fmt.Fprintln(w, "\nCPU per relayed token by process, µs (iop halves of workloads 1–3):")
	t = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	var names []string
	for _, cw := range r.CPU.Workloads {
		for name := range cw.ByProcess {
			if !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
	}
	sortProcs(names)
	fmt.Fprintf(t, "workload\ttokens\t%s\ttotal\t\n", strings.Join(names, "\t"))
	labels := map[int]string{1: "1 (1 stream)", 2: fmt.Sprintf("2 (%d streams)", n), 3: "3 (long stream)"}
	for _, cw := range r.CPU.Workloads {
		fmt.Fprintf(t, "%s\t%d\t", labels[cw.Workload], cw.Tokens)
		for _, name := range names {
			fmt.Fprintf(t, "%.1f\t", perToken(cw.ByProcess[name], cw.Tokens))
		}
		fmt.Fprintf(t, "%.1f\t\n", perToken(cw.Total, cw.Tokens))
	}
	t.Flush()

	fmt.Fprintln(w, "\nPeak memory (VmHWM):")
	t = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, m := range r.Memory {
		fmt.Fprintf(t, "  %s\t%.1f MiB\t\n", m.Process, float64(m.PeakRSS)/(1<<20))
	}
	t.Flush()
}

func perToken(d time.Duration, tokens int) float64 {
	if tokens == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(tokens)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }
func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/1e3) }

func signed(d time.Duration) string {
	if d < 0 {
		return "-" + ms(-d)
	}
	return "+" + ms(d)
}

// sortProcs orders process names: edged, noded, then plugins by name.
func sortProcs(names []string) {
	rank := func(s string) string {
		switch s {
		case "edged":
			return "0"
		case "noded":
			return "1"
		}
		return "2" + s
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(rank(a), rank(b)) })
}
