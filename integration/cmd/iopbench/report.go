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

// print writes the tables: for each API its figures beside direct, the
// targets, the CPU by process and workload, peak memory, the scale
// workloads, the profiles and the notes.
func (r *results) print(w io.Writer) {
	run := "full run"
	if r.Quick {
		run = "quick run (-quick)"
	}
	fmt.Fprintf(w, "IOP benchmark: %s, %d CPUs, %s\n", run, r.CPUs, r.GoVersion)
	fmt.Fprintf(w, "direct: POST /api/chat to the fake Ollama, measured just before each API's iop half\n")
	n := r.Config.Streams
	for _, a := range r.APIs {
		where := "on the Edge"
		if a.API == apiFloor.Key {
			where = "through quicfloor"
		}
		fmt.Fprintf(w, "\n%s: POST %s %s, %s\n", a.Label, a.Path, where, a.Way)
		r.printAPI(w, a, n)
	}

	printTargets(w, "Targets (issue 14):", r.Targets)
	printTargets(w, "Targets (issue 25, where they differ; the 10,000-run figure is issue 14's above):", r.Targets25)
	r.printFloor(w, n)

	r.printCPU(w, n)
	r.printMemory(w, n)
	if r.Scale != nil {
		r.Scale.print(w)
	}
	if len(r.Profiles) > 0 {
		fmt.Fprintln(w, "\nProfiles (perf, workload 2's iop halves; perf's overhead is in that run's figures of workload 2):")
		for _, p := range r.Profiles {
			if p.Error != "" {
				fmt.Fprintf(w, "  %s, %s: %s\n", p.API, p.Process, p.Error)
				continue
			}
			fmt.Fprintf(w, "  %s, %s (%v): %s\n", p.API, p.Process, p.Window.Round(time.Millisecond), p.Report)
			if len(p.Top) == 0 {
				fmt.Fprintln(w, "      no samples: it used no CPU in the window")
			}
			for _, l := range p.Top[:min(len(p.Top), 5)] {
				fmt.Fprintf(w, "      %s\n", l)
			}
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w, "\nNotes:")
		for _, s := range r.Notes {
			fmt.Fprintf(w, "  %s\n", s)
		}
	}
}

// printAPI is one API's figures beside direct.
func (r *results) printAPI(w io.Writer, a *apiResults, n int) {
	t := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(t, "\tdirect\t%s\tadded\tiop/direct\t\n", a.API)
	durRow := func(name string, d, i time.Duration) {
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%.2f\t\n", name, ms(d), ms(i), signed(i-d), ratio(float64(i), float64(d)))
	}
	rateRow := func(name string, d, i float64) {
		fmt.Fprintf(t, "%s\t%.0f\t%.0f\t%+.0f\t%.3f\t\n", name, d, i, i-d, ratio(i, d))
	}
	iopRow := func(name, v string) { fmt.Fprintf(t, "%s\t\t%s\t\t\t\n", name, v) }
	summed := "IOP summed"
	if a.API == apiFloor.Key {
		summed = "quicfloor summed"
	}
	if s := a.Single; s != nil {
		durRow("1 stream: TTFB p50", s.Direct.TTFBP50, s.IOP.TTFBP50)
		durRow("1 stream: TTFB p99", s.Direct.TTFBP99, s.IOP.TTFBP99)
		durRow("1 stream: request leg of TTFB, p50", s.Direct.RequestLegP50, s.IOP.RequestLegP50)
		rateRow("1 stream: tokens/s", s.Direct.TokensPerSec, s.IOP.TokensPerSec)
		durRow("1 stream: provider's answer time, p50", s.Direct.ProviderAnswerP50, s.IOP.ProviderAnswerP50)
	}
	if c := a.Concurrent; c != nil {
		durRow(fmt.Sprintf("%d streams: TTFB p50", n), c.Direct.TTFBP50, c.IOP.TTFBP50)
		durRow(fmt.Sprintf("%d streams: TTFB p99", n), c.Direct.TTFBP99, c.IOP.TTFBP99)
		durRow(fmt.Sprintf("%d streams: request leg of TTFB, p50", n), c.Direct.RequestLegP50, c.IOP.RequestLegP50)
		rateRow(fmt.Sprintf("%d streams: tokens/s", n), c.Direct.TokensPerSec, c.IOP.TokensPerSec)
		durRow(fmt.Sprintf("%d streams: provider's answer time, p50", n), c.Direct.ProviderAnswerP50, c.IOP.ProviderAnswerP50)
		fmt.Fprintf(t, "%d streams: failed answers\t%d/%d\t%d/%d\t\t\t\n", n, c.Direct.Failed, c.Direct.Answers, c.IOP.Failed, c.IOP.Answers)
		if cw := a.cpu(2); cw != nil {
			iopRow(fmt.Sprintf("%d streams: CPU per relayed token, %s", n, summed), us(cw.perToken()))
		}
		if m := a.ConcurrentRSS; m != nil {
			iopRow(fmt.Sprintf("%d streams: peak RSS, %s", n, summed), mib(m.Total))
		}
	}
	if l := a.Long; l != nil {
		rateRow(fmt.Sprintf("long stream (%d tokens): tokens/s", r.Config.LongTokens), l.Direct.TokensPerSec, l.IOP.TokensPerSec)
		durRow("long stream: largest gap between tokens", l.Direct.MaxGap, l.IOP.MaxGap)
	}
	if p := a.Prefill; p != nil && r.Prefill != nil {
		durRow(fmt.Sprintf("prefill %v: TTFB", r.Prefill.Duration), p.Direct.TTFB, p.IOP.TTFB)
		fmt.Fprintf(t, "prefill: terminal\t%s\t%s\t\t\t\n", doneWord(p.Direct.Done), doneWord(p.IOP.Done))
	}
	if g := a.ClientGone; g != nil {
		durRow("client gone → provider sees it, p50", g.Direct.P50, g.IOP.P50)
		durRow("client gone → provider sees it, max", g.Direct.Max, g.IOP.Max)
	}
	t.Flush()
}

// printFloor sets the tunnel's figures of issue 25 beside the floor's of
// the same run: what IOP adds over a bare relay on quic-go, and what the
// transport alone costs. Nothing when either was not measured.
func (r *results) printFloor(w io.Writer, n int) {
	var tunnel, fl *apiResults
	for _, a := range r.APIs {
		switch a.API {
		case apiOllama.Key:
			tunnel = a
		case apiFloor.Key:
			fl = a
		}
	}
	if tunnel == nil || fl == nil {
		return
	}
	fmt.Fprintln(w, "\nThe tunnel beside the transport's floor (quicfloor, a bare relay over quic-go, this run):")
	t := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(t, "\tollama\tfloor\tIOP's own\t\n")
	if a, f := tunnel.Single, fl.Single; a != nil && f != nil {
		added := func(p *pair[streamsFigures]) time.Duration { return p.IOP.TTFBP50 - p.Direct.TTFBP50 }
		fmt.Fprintf(t, "1 stream: TTFB added, p50\t%s\t%s\t%s\t\n", signed(added(a)), signed(added(f)), signed(added(a)-added(f)))
		leg := func(p *pair[streamsFigures]) time.Duration { return p.IOP.RequestLegP50 - p.Direct.RequestLegP50 }
		fmt.Fprintf(t, "1 stream: request leg added, p50\t%s\t%s\t%s\t\n", signed(leg(a)), signed(leg(f)), signed(leg(a)-leg(f)))
	}
	if a, f := tunnel.cpu(2), fl.cpu(2); a != nil && f != nil {
		fmt.Fprintf(t, "%d streams: CPU per relayed token\t%s\t%s\t%+.1f µs\t\n", n, us(a.perToken()), us(f.perToken()),
			float64(a.perToken()-f.perToken())/1e3)
	}
	if a, f := tunnel.ConcurrentRSS, fl.ConcurrentRSS; a != nil && f != nil {
		fmt.Fprintf(t, "%d streams: peak RSS, summed\t%s\t%s\t%+.1f MiB\t\n", n, mib(a.Total), mib(f.Total), float64(a.Total-f.Total)/(1<<20))
	}
	t.Flush()
}

// printCPU is the CPU per relayed token by process, each API's iop halves.
func (r *results) printCPU(w io.Writer, n int) {
	var all []map[string]time.Duration
	for _, a := range r.APIs {
		for _, cw := range a.CPU {
			all = append(all, cw.ByProcess)
		}
	}
	if len(all) == 0 {
		return
	}
	names := sortedNames(all...)
	fmt.Fprintln(w, "\nCPU per relayed token by process, µs (iop halves of workloads 1–3):")
	t := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(t, "api\tworkload\ttokens\t%s\ttotal\t\n", strings.Join(names, "\t"))
	labels := map[int]string{1: "1 (1 stream)", 2: fmt.Sprintf("2 (%d streams)", n), 3: "3 (long stream)"}
	for _, a := range r.APIs {
		for _, cw := range a.CPU {
			fmt.Fprintf(t, "%s\t%s\t%d\t", a.API, labels[cw.Workload], cw.Tokens)
			for _, name := range names {
				if d, ok := cw.ByProcess[name]; ok {
					fmt.Fprintf(t, "%.1f\t", perToken(d, cw.Tokens))
				} else {
					fmt.Fprint(t, "–\t") // not a process of this row's
				}
			}
			fmt.Fprintf(t, "%.1f\t\n", perToken(cw.Total, cw.Tokens))
		}
	}
	t.Flush()
}

// printMemory is the peak resident set at workload 2, by process and
// summed, then over the whole run.
func (r *results) printMemory(w io.Writer, n int) {
	var rows []*apiResults
	names := map[string]int64{}
	for _, a := range r.APIs {
		if a.ConcurrentRSS != nil {
			rows = append(rows, a)
			for _, m := range a.ConcurrentRSS.Processes {
				names[m.Process] = 0
			}
		}
	}
	if len(rows) > 0 {
		fmt.Fprintf(w, "\nPeak RSS at %d streams, MiB (VmHWM reset before the iop half of workload 2, read after):\n", n)
		t := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		cols := sortedNames(names)
		fmt.Fprintf(t, "api\t%s\tsummed\t\n", strings.Join(cols, "\t"))
		for _, a := range rows {
			fmt.Fprintf(t, "%s\t", a.API)
			for _, c := range cols {
				if b, ok := rssOf(a.ConcurrentRSS.Processes, c); ok {
					fmt.Fprintf(t, "%.1f\t", float64(b)/(1<<20))
				} else {
					fmt.Fprint(t, "–\t")
				}
			}
			fmt.Fprintf(t, "%.1f\t\n", float64(a.ConcurrentRSS.Total)/(1<<20))
		}
		t.Flush()
	}
	if len(r.Memory) > 0 {
		fmt.Fprintln(w, "\nPeak memory over the whole run (VmHWM, main stack):")
		t := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		for _, m := range r.Memory {
			fmt.Fprintf(t, "  %s\t%s\t\n", m.Process, mib(m.PeakRSS))
		}
		t.Flush()
	}
}

// rssOf is the peak of the process named name, if ms has it.
func rssOf(ms []memFigure, name string) (int64, bool) {
	for _, m := range ms {
		if m.Process == name {
			return m.PeakRSS, true
		}
	}
	return 0, false
}

// print writes workloads 8 and 9: one column per API.
func (s *scaleResults) print(w io.Writer) {
	fmt.Fprintf(w, "\nScale (workloads 8 and 9), each on a fresh stack sized for it; RLIMIT_NOFILE %d\n", s.FDLimit)
	if len(s.Runs) > 0 {
		f0 := s.Runs[0]
		fmt.Fprintf(w, "\n8: %d runs at once in a silent prefill of %v, then %d tokens; one Node with %d ollama provider(s) of capacity %d, Edge max_connections %d\n",
			f0.Runs, f0.Prefill, scaleAnswerTokens, f0.Providers, f0.Capacity, f0.MaxConns)
		t := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		row := func(name string, v func(f scaleRunsFigures) string) {
			fmt.Fprintf(t, "%s\t", name)
			for _, f := range s.Runs {
				fmt.Fprintf(t, "%s\t", v(f))
			}
			fmt.Fprintln(t)
		}
		row("", func(f scaleRunsFigures) string { return f.API })
		row("completed / failed", func(f scaleRunsFigures) string { return fmt.Sprintf("%d / %d", f.Completed, f.Failed) })
		row("most at the provider at once", func(f scaleRunsFigures) string {
			if f.InFlightError != "" {
				return "unknown: " + f.InFlightError
			}
			return fmt.Sprint(f.PeakInFlight)
		})
		row("first sent → the provider had all", func(f scaleRunsFigures) string { return secs(f.Ramp) })
		row("TTFB beyond the prefill, p50 / max", func(f scaleRunsFigures) string {
			return fmt.Sprintf("%s / %s", secs(f.WaitP50), secs(f.WaitMax))
		})
		row("wall", func(f scaleRunsFigures) string { return secs(f.Wall) })
		row("CPU per run, IOP summed", func(f scaleRunsFigures) string {
			return ms(f.CPU.Total / time.Duration(max(f.Runs, 1)))
		})
		scaleCommonRows(t, len(s.Runs), func(i int) scaleCommon { return s.Runs[i].scaleCommon })
		t.Flush()
		for _, f := range s.Runs {
			f.printProblems(w)
		}
	}
	if len(s.Streams) > 0 {
		f0 := s.Streams[0]
		fmt.Fprintf(w, "\n9: %d streams at once, a token every %v for %v (%d tokens each); one Node with %d ollama provider(s) of capacity %d, Edge max_connections %d\n",
			f0.Streams, f0.Gap, f0.Duration, f0.TokensExpected/max(f0.Streams, 1), f0.Providers, f0.Capacity, f0.MaxConns)
		t := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		row := func(name string, v func(f scaleStreamsFigures) string) {
			fmt.Fprintf(t, "%s\t", name)
			for _, f := range s.Streams {
				fmt.Fprintf(t, "%s\t", v(f))
			}
			fmt.Fprintln(t)
		}
		row("", func(f scaleStreamsFigures) string { return f.API })
		row("tokens expected / received", func(f scaleStreamsFigures) string {
			return fmt.Sprintf("%d / %d", f.TokensExpected, f.TokensReceived)
		})
		row("streams whole (every token in order, terminal)", func(f scaleStreamsFigures) string {
			return fmt.Sprintf("%d / %d", f.Complete, f.Streams)
		})
		row("failed / altered", func(f scaleStreamsFigures) string { return fmt.Sprintf("%d / %d", f.Failed, f.Altered) })
		row("largest gap between tokens, max / p99", func(f scaleStreamsFigures) string {
			return fmt.Sprintf("%s / %s", ms(f.MaxGap), ms(f.GapP99))
		})
		row("wall", func(f scaleStreamsFigures) string { return secs(f.Wall) })
		names := map[string]time.Duration{}
		for _, f := range s.Streams {
			for name := range f.CPU.ByProcess {
				names[name] = 0
			}
		}
		for _, name := range sortedNames(names) {
			row("CPU per token, µs: "+name, func(f scaleStreamsFigures) string {
				return fmt.Sprintf("%.1f", perToken(f.CPU.ByProcess[name], f.CPU.Tokens))
			})
		}
		row("CPU per token, µs: IOP summed", func(f scaleStreamsFigures) string {
			return fmt.Sprintf("%.1f", perToken(f.CPU.Total, f.CPU.Tokens))
		})
		scaleCommonRows(t, len(s.Streams), func(i int) scaleCommon { return s.Streams[i].scaleCommon })
		t.Flush()
		for _, f := range s.Streams {
			f.printProblems(w)
		}
	}
	if s.Broken != "" {
		fmt.Fprintf(w, "\nThe scale stack broke: %s\n", s.Broken)
	}
}

// scaleCommonRows are the rows both scale workloads print: peak memory
// and the heartbeat.
func scaleCommonRows(t io.Writer, n int, f func(i int) scaleCommon) {
	row := func(name string, v func(c scaleCommon) string) {
		fmt.Fprintf(t, "%s\t", name)
		for i := range n {
			fmt.Fprintf(t, "%s\t", v(f(i)))
		}
		fmt.Fprintln(t)
	}
	names := map[string]int64{}
	for i := range n {
		if m := f(i).RSS; m != nil {
			for _, p := range m.Processes {
				names[label(p)] = 0
			}
		}
	}
	for _, name := range sortedNames(names) {
		row("peak RSS: "+name, func(c scaleCommon) string {
			for _, p := range c.RSS.Processes {
				if label(p) == name {
					return mib(p.PeakRSS)
				}
			}
			return ""
		})
	}
	row("peak RSS: IOP summed", func(c scaleCommon) string {
		s := mib(c.RSS.Total)
		if !c.RSS.Reset {
			s += " (not reset)"
		}
		return s
	})
	row("heartbeat RTT, max / p99", func(c scaleCommon) string {
		if c.Heartbeat.Heartbeats == 0 {
			return "none answered in the window"
		}
		return fmt.Sprintf("%s / %s", ms(c.Heartbeat.RTTMax), ms(c.Heartbeat.RTTP99))
	})
	row("heartbeats answered / admin polls", func(c scaleCommon) string {
		return fmt.Sprintf("%d / %d", c.Heartbeat.Heartbeats, c.Heartbeat.Polls)
	})
	row("last answered heartbeat's largest age", func(c scaleCommon) string {
		if c.Heartbeat.MaxAge == 0 {
			return "none answered yet"
		}
		return secs(c.Heartbeat.MaxAge)
	})
	row("slowest admin poll", func(c scaleCommon) string { return ms(c.Heartbeat.SlowestPoll) })
	row("Node stayed ready on its generation", func(c scaleCommon) string {
		if c.Heartbeat.StayedReady {
			return "yes"
		}
		return fmt.Sprintf("no: %v", c.Heartbeat.Seen)
	})
}

// label names a process row: "plugin ollama (×3)" for several alike.
func label(m memFigure) string {
	if m.Count > 1 {
		return fmt.Sprintf("%s (×%d)", m.Process, m.Count)
	}
	return m.Process
}

// printProblems lists what went wrong in a scale workload: the errors,
// processes that exited, poll failures and the end of the daemons' logs.
func (c scaleCommon) printProblems(w io.Writer) {
	if c.Failed == 0 && len(c.Exited) == 0 && c.Heartbeat.PollErrors == 0 && len(c.EdgeLog) == 0 {
		return
	}
	fmt.Fprintf(w, "  %s: %d failed", c.API, c.Failed)
	if len(c.Errors) > 0 {
		fmt.Fprintf(w, "; the first %d errors:\n", len(c.Errors))
		for _, e := range c.Errors {
			fmt.Fprintf(w, "    %s\n", e)
		}
	} else {
		fmt.Fprintln(w)
	}
	if len(c.Exited) > 0 {
		fmt.Fprintf(w, "    processes that exited meanwhile: %s\n", strings.Join(c.Exited, ", "))
	}
	if c.Heartbeat.PollErrors > 0 {
		fmt.Fprintf(w, "    %d admin polls failed, the first: %s\n", c.Heartbeat.PollErrors, c.Heartbeat.FirstPollError)
	}
	for _, l := range []struct {
		name  string
		lines []string
	}{{"edged", c.EdgeLog}, {"noded", c.NodeLog}} {
		if len(l.lines) > 0 {
			fmt.Fprintf(w, "    %s log ends:\n", l.name)
			for _, s := range l.lines {
				fmt.Fprintf(w, "      %s\n", s)
			}
		}
	}
}

func perToken(d time.Duration, tokens int) float64 {
	if tokens == 0 {
		return 0
	}
	return float64(d.Nanoseconds()) / 1e3 / float64(tokens)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func ms(d time.Duration) string   { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }
func us(d time.Duration) string   { return fmt.Sprintf("%.1f µs", float64(d)/1e3) }
func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }
func mib(b int64) string          { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

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

// printTargets writes one issue's verdicts under title; nothing when none
// was measured.
func printTargets(w io.Writer, title string, targets []verdict) {
	if len(targets) == 0 {
		return
	}
	fmt.Fprintln(w, "\n"+title)
	t := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, v := range targets {
		word := "MET"
		switch {
		case v.NotMeasured:
			word = "NOT MEASURED"
		case !v.Met:
			word = "MISSED"
		}
		detail := v.Detail
		if len(detail) > 100 {
			detail = detail[:100] + "…"
		}
		fmt.Fprintf(t, "  %s\t%s\t%s\t%s\n", v.Target, v.Measured, word, detail)
	}
	t.Flush()
}
