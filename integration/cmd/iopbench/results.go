package main

import (
	"fmt"
	"slices"
	"time"
)

// results is everything one run measured; it is also the -out JSON.
// Durations are in nanoseconds, memory in bytes. A workload that did not
// run (-only, -apis) is absent.
type results struct {
	Quick     bool       `json:"quick"`
	CPUs      int        `json:"cpus"`
	GoVersion string     `json:"go_version"`
	Config    configJSON `json:"config"`
	// Notes say what the bench could not do as asked (a limit it could not
	// raise, a peak it could not reset, perf missing).
	Notes []string `json:"notes,omitempty"`

	// APIs are workloads 1–4 and 7, for each API measured.
	APIs    []*apiResults `json:"apis"`
	Prefill *prefillRun   `json:"prefill,omitempty"`
	// Memory is the peak resident set of each process of the main stack
	// over the whole run, and of the bench itself.
	Memory   []memFigure     `json:"peak_memory"`
	Scale    *scaleResults   `json:"scale,omitempty"`
	Profiles []profileFigure `json:"profiles,omitempty"`
	Targets  []verdict       `json:"targets"`
	// Targets25 are issue 25's targets where they differ from issue 14's
	// (a lean relay: measured against the peers' figures).
	Targets25 []verdict `json:"targets_issue25"`
}

func (r *results) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// apiResults are workloads 1–4 and 7 through one of the Edge's APIs, each
// beside the same workload straight to the provider, measured just before.
type apiResults struct {
	API        string                `json:"api"`
	Label      string                `json:"label"`
	Path       string                `json:"path"`
	Way        string                `json:"way"`
	Single     *pair[streamsFigures] `json:"single_stream,omitempty"`
	Concurrent *pair[streamsFigures] `json:"concurrent_streams,omitempty"`
	// ConcurrentRSS is the peak resident set of the IOP processes during
	// the iop half of workload 2 alone.
	ConcurrentRSS *rssFigures           `json:"concurrent_streams_peak_rss,omitempty"`
	Long          *pair[longFigures]    `json:"long_stream,omitempty"`
	Prefill       *pair[prefillFigures] `json:"prefill,omitempty"`
	ClientGone    *pair[goneFigures]    `json:"client_gone,omitempty"`
	// CPU is what the IOP processes used during the iop halves of
	// workloads 1–3.
	CPU []cpuWorkload `json:"cpu"`
}

// cpu returns the CPU of workload w, or nil.
func (a *apiResults) cpu(w int) *cpuWorkload {
	for i := range a.CPU {
		if a.CPU[i].Workload == w {
			return &a.CPU[i]
		}
	}
	return nil
}

// pair is one workload's figures on both sides.
type pair[T any] struct {
	Direct T `json:"direct"`
	IOP    T `json:"iop"`
}

// prefillRun is what workload 4 found beyond each side's figures.
type prefillRun struct {
	Duration           time.Duration `json:"prefill_ns"`
	NodeKeptGeneration bool          `json:"node_kept_ready_generation"`
}

type configJSON struct {
	APIs          []string      `json:"apis"`
	Capacity      int           `json:"capacity"`
	Tokens        int           `json:"tokens"`
	TokenDelay    time.Duration `json:"token_delay_ns"`
	SingleReps    int           `json:"single_reps"`
	SingleGap     time.Duration `json:"single_gap_ns,omitempty"`
	Streams       int           `json:"streams"`
	StreamReps    int           `json:"stream_reps"`
	LongTokens    int           `json:"long_tokens"`
	LongReps      int           `json:"long_reps"`
	Prefill       time.Duration `json:"prefill_ns"`
	GoneTries     int           `json:"gone_tries"`
	ScaleRuns     int           `json:"scale_runs"`
	ScalePrefill  time.Duration `json:"scale_prefill_ns"`
	ScaleStreams  int           `json:"scale_streams"`
	ScaleDuration time.Duration `json:"scale_duration_ns"`
	ScaleGap      time.Duration `json:"scale_gap_ns"`
	Only          string        `json:"only,omitempty"`
}

func (c config) export() configJSON {
	var apis []string
	for _, a := range c.apis {
		apis = append(apis, a.Key)
	}
	return configJSON{apis, c.capacity, c.tokens, c.tokenDelay, c.singleReps, c.singleGap, c.streams, c.streamReps,
		c.longTokens, c.longReps, c.prefill, c.goneTries,
		c.scaleRuns, c.scalePrefill, c.scaleStreams, c.scaleDuration, c.scaleGap, c.only}
}

// cpuWorkload is the CPU the IOP processes used during the iop half of one
// workload, summed by process name.
type cpuWorkload struct {
	Workload  int                      `json:"workload"`
	Tokens    int                      `json:"tokens"`
	Total     time.Duration            `json:"total_ns"`
	ByProcess map[string]time.Duration `json:"by_process_ns"`
}

func newCPUWorkload(w, tokens int, procs []proc, used map[int]time.Duration) cpuWorkload {
	cw := cpuWorkload{Workload: w, Tokens: tokens, ByProcess: map[string]time.Duration{}}
	for _, p := range procs {
		cw.ByProcess[p.name] += used[p.pid]
		cw.Total += used[p.pid]
	}
	return cw
}

// perToken is the CPU per token relayed, all processes together.
func (cw cpuWorkload) perToken() time.Duration {
	if cw.Tokens == 0 {
		return 0
	}
	return cw.Total / time.Duration(cw.Tokens)
}

type memFigure struct {
	Process string `json:"process"`
	PeakRSS int64  `json:"peak_rss_bytes"`
	Count   int    `json:"count,omitempty"` // processes of this name, when more than one
}

// rssFigures are the peak resident sets of the IOP processes during one
// workload: reset before it, read after.
type rssFigures struct {
	// Reset says the peaks were reset before the workload; if not, each is
	// the peak since the process started.
	Reset     bool        `json:"reset"`
	Processes []memFigure `json:"processes"`
	Total     int64       `json:"total_bytes"`
}

func (f *rssFigures) add(name string, rss int64) {
	f.Total += rss
	for i := range f.Processes {
		if f.Processes[i].Process == name {
			f.Processes[i].PeakRSS += rss
			f.Processes[i].Count = max(f.Processes[i].Count, 1) + 1
			return
		}
	}
	f.Processes = append(f.Processes, memFigure{Process: name, PeakRSS: rss})
}

// verdict is one target of issue 14 against what was measured.
type verdict struct {
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
	// NotMeasured: the run could not measure it (no heartbeat in the
	// window, a peak that could not be reset).
	NotMeasured bool   `json:"not_measured,omitempty"`
	Detail      string `json:"detail"` // by how much it was met or missed
}

// Issue 14's targets.
const (
	targetTTFBTunnel     = 500 * time.Microsecond // 1 stream, TTFB added, p50
	targetTTFBNormalized = time.Millisecond
	targetConcP50        = 3 * time.Millisecond // 64 streams, TTFB added
	targetConcP99        = 6 * time.Millisecond
	targetConcRate       = 0.99 // 64 streams, tokens/s of direct
	targetLongRate       = 0.95 // the long stream, tokens/s of direct
	targetCPUTunnel      = 20 * time.Microsecond
	targetCPUNormalized  = 30 * time.Microsecond
	targetConcRSS        = 64 << 20 // summed over the IOP processes
	targetGone           = 10 * time.Millisecond
	targetScaleRSS       = 512 << 20 // workload 8, summed
	targetHeartbeatRTT   = 100 * time.Millisecond
)

// Issue 25's targets, where they differ from issue 14's: the tunnel's
// figures, beside its peers' (frp over QUIC, Olla).
const (
	target25TTFB    = time.Millisecond // 1 stream, TTFB added, p50, burst or sparse
	target25CPU     = 36 * time.Microsecond
	target25ConcRSS = 56 << 20
)

// evaluate25 computes issue 25's verdicts for what ran through the
// tunnel; the normalized path's figures are in the tables beside them.
func (r *results) evaluate25() {
	r.Targets25 = nil
	add := func(v verdict) { r.Targets25 = append(r.Targets25, v) }
	answers := "sparse"
	if r.Config.TokenDelay == 0 {
		answers = "burst"
	}
	for _, a := range r.APIs {
		if a.API != apiOllama.Key {
			continue
		}
		p := a.API + ": "
		if s := a.Single; s != nil {
			add(atMost(p+"1 stream ("+answers+"): TTFB added, p50 ≤ "+short(target25TTFB), s.IOP.TTFBP50-s.Direct.TTFBP50, target25TTFB))
		}
		if c := a.Concurrent; c != nil {
			n := fmt.Sprintf("%d streams", r.Config.Streams)
			if cw := a.cpu(2); cw != nil {
				add(atMost(p+n+": CPU per relayed token, IOP processes summed ≤ "+short(target25CPU), cw.perToken(), target25CPU))
			}
			if m := a.ConcurrentRSS; m != nil {
				add(peakAtMost(p+n+": peak RSS, IOP processes summed ≤ 56 MiB", m, target25ConcRSS))
			}
		}
	}
}

// evaluate computes the verdicts for what ran.
func (r *results) evaluate() {
	r.evaluate25()
	r.Targets = nil
	add := func(v verdict) { r.Targets = append(r.Targets, v) }
	n := fmt.Sprintf("%d streams", r.Config.Streams)
	for _, a := range r.APIs {
		if a.API == apiFloor.Key { // not IOP: its figures stand beside the targets
			continue
		}
		ttfb, cpu := targetTTFBNormalized, targetCPUNormalized
		if a.API == apiOllama.Key {
			ttfb, cpu = targetTTFBTunnel, targetCPUTunnel
		}
		p := a.API + ": "
		if s := a.Single; s != nil {
			add(atMost(p+"1 stream: TTFB added, p50 ≤ "+short(ttfb), s.IOP.TTFBP50-s.Direct.TTFBP50, ttfb))
		}
		if c := a.Concurrent; c != nil {
			add(atMost(p+n+": TTFB added, p50 ≤ "+short(targetConcP50), c.IOP.TTFBP50-c.Direct.TTFBP50, targetConcP50))
			add(atMost(p+n+": TTFB added, p99 ≤ "+short(targetConcP99), c.IOP.TTFBP99-c.Direct.TTFBP99, targetConcP99))
			add(atLeastRatio(p+n+fmt.Sprintf(": tokens/s ≥ %.2f of direct", targetConcRate), c.IOP.TokensPerSec, c.Direct.TokensPerSec, targetConcRate))
			add(verdict{
				Target:   fmt.Sprintf("%s%s: no refusal below capacity %d", p, n, r.Config.Capacity),
				Measured: fmt.Sprintf("%d of %d answers failed", c.IOP.Failed, c.IOP.Answers),
				Met:      c.IOP.Failed == 0 && c.IOP.Answers > 0,
				Detail:   c.IOP.FirstFailure,
			})
			if cw := a.cpu(2); cw != nil {
				add(atMost(p+n+": CPU per relayed token, IOP processes summed ≤ "+short(cpu), cw.perToken(), cpu))
			}
			if m := a.ConcurrentRSS; m != nil {
				add(peakAtMost(p+n+": peak RSS, IOP processes summed ≤ 64 MiB", m, targetConcRSS))
			}
		}
		if l := a.Long; l != nil {
			add(atLeastRatio(p+fmt.Sprintf("long stream: tokens/s ≥ %.2f of direct", targetLongRate), l.IOP.TokensPerSec, l.Direct.TokensPerSec, targetLongRate))
		}
		if f := a.Prefill; f != nil && r.Prefill != nil {
			add(verdict{
				Target:   p + "long prefill: normal terminal, Node stays ready",
				Measured: fmt.Sprintf("terminal: %s; node kept its ready generation: %v", doneWord(f.IOP.Done), r.Prefill.NodeKeptGeneration),
				Met:      f.IOP.Done && r.Prefill.NodeKeptGeneration,
			})
		}
		if g := a.ClientGone; g != nil {
			add(atMost(p+"client gone → provider request cancelled, p50 ≤ "+short(targetGone), g.IOP.P50, targetGone))
		}
	}
	if r.Scale != nil {
		r.Scale.evaluate(add)
	}
}

func (s *scaleResults) evaluate(add func(verdict)) {
	for _, f := range s.Runs {
		p := fmt.Sprintf("%s: %d concurrent runs in silent prefill: ", f.API, f.Runs)
		v := verdict{Target: p + "every one completes", Measured: fmt.Sprintf("%d completed, %d failed", f.Completed, f.Failed),
			Met: f.Completed == f.Runs && f.Failed == 0}
		if len(f.Errors) > 0 {
			v.Detail = f.Errors[0]
		} else if f.PeakInFlight < f.Runs {
			v.Detail = fmt.Sprintf("but only %d were at the provider at once", f.PeakInFlight)
		}
		add(v)
		if f.RSS != nil {
			rv := atMostBytes(p+"peak RSS, IOP processes summed ≤ 512 MiB", f.RSS.Total, targetScaleRSS)
			if !f.RSS.Reset {
				rv.Met, rv.NotMeasured, rv.Detail = false, true, "the peaks could not be reset"
			}
			add(rv)
		}
		add(f.Heartbeat.verdict(p + "heartbeat RTT < " + short(targetHeartbeatRTT) + " throughout"))
	}
	for _, f := range s.Streams {
		v := verdict{
			Target: fmt.Sprintf("%s: %d streams, a token every %v for %v: nothing lost", f.API, f.Streams, f.Gap, f.Duration),
			Measured: fmt.Sprintf("%d of %d streams whole; %d of %d tokens", f.Complete, f.Streams,
				f.TokensReceived, f.TokensExpected),
			Met: f.Complete == f.Streams && f.TokensReceived == f.TokensExpected,
		}
		if len(f.Errors) > 0 {
			v.Detail = f.Errors[0]
		}
		add(v)
	}
}

// short writes a target's duration as people write it: "0.5 ms", "20 µs".
func short(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%g µs", float64(d)/1e3)
	}
	return fmt.Sprintf("%g ms", float64(d)/1e6)
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

// peakAtMost is atMostBytes for the peaks of the load's processes, not
// measured when they could not be reset before it.
func peakAtMost(target string, m *rssFigures, limit int64) verdict {
	v := atMostBytes(target, m.Total, limit)
	if !m.Reset {
		v.Met, v.NotMeasured, v.Detail = false, true, "the peaks could not be reset: this is since each process started"
	}
	return v
}

func atMostBytes(target string, got, limit int64) verdict {
	v := verdict{Target: target, Measured: mib(got), Met: got <= limit}
	if v.Met {
		v.Detail = mib(limit-got) + " to spare"
	} else {
		v.Detail = fmt.Sprintf("missed by %s (%.1f× the target)", mib(got-limit), float64(got)/float64(limit))
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

// sortedNames returns the keys of m in process order.
func sortedNames[V any](ms ...map[string]V) []string {
	var names []string
	for _, m := range ms {
		for name := range m {
			if !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
	}
	sortProcs(names)
	return names
}
