package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// bench runs workloads 1–4 and 7 against the main stack and fills res.
type bench struct {
	cfg    config
	s      *stack
	floor  *floor // nil unless the floor is measured
	c      *http.Client
	direct side
	apis   []apiRun
	res    *results
	log    io.Writer
	// peaks is the largest VmHWM read of each IOP process (by name) over
	// the whole run: resetting the peak before workload 2's iop halves
	// would otherwise lose what came before.
	peaks map[string]int64
}

// apiRun is one API's iop side and the figures measured with it.
type apiRun struct {
	side side
	r    *apiResults
}

// newBench prepares the runs of cfg.apis: the Edge's APIs on s, the floor
// on fl (nil when cfg.apis has no floor).
func newBench(cfg config, s *stack, fl *floor, c *http.Client, res *results, log io.Writer) *bench {
	b := &bench{cfg: cfg, s: s, floor: fl, c: c, res: res, log: log, peaks: map[string]int64{},
		direct: side{name: "direct", api: apiOllama, base: s.fakeURL}}
	for _, a := range cfg.apis {
		r := &apiResults{API: a.Key, Label: a.Label, Path: a.Path, Way: a.Way}
		res.APIs = append(res.APIs, r)
		base := s.base
		if a.Floor {
			base = fl.base
		}
		b.apis = append(b.apis, apiRun{side: side{name: a.Label, api: a, base: base}, r: r})
	}
	return b
}

// procs are the processes a's iop half runs through: IOP's, or the
// floor's.
func (b *bench) procs(a apiRun) []proc {
	if a.side.api.Floor {
		return b.floor.procs()
	}
	return b.s.iopProcs()
}

// onIOP runs fn (the iop half of a workload), and charges the CPU the IOP
// processes (the floor's, for the floor) used meanwhile to workload w
// (1–3) of a with the tokens fn relayed.
func (b *bench) onIOP(a apiRun, w int, fn func() (tokens int, err error)) error {
	procs := b.procs(a)
	before := sampleCPU(procs)
	tokens, err := fn()
	used := cpuSince(before, procs)
	if err != nil {
		return err
	}
	a.r.CPU = append(a.r.CPU, newCPUWorkload(w, tokens, procs, used))
	return nil
}

func (b *bench) warm(ctx context.Context) error {
	sides := []side{b.direct}
	for _, a := range b.apis {
		sides = append(sides, a.side)
	}
	for _, sd := range sides {
		if err := warm(ctx, b.c, sd, b.cfg.streams); err != nil {
			return err
		}
	}
	return nil
}

// single is workload 1. For each API, the direct half runs right before
// the iop half, so that the two see the machine alike.
func (b *bench) single(ctx context.Context) error {
	for _, a := range b.apis {
		f := &pair[streamsFigures]{}
		var err error
		if f.Direct, err = streams(ctx, b.c, b.s.fake, b.direct, modelStream, 1, b.cfg.singleReps, 0, b.cfg.singleGap); err != nil {
			return err
		}
		if err := b.onIOP(a, 1, func() (int, error) {
			f.IOP, err = streams(ctx, b.c, b.s.fake, a.side, modelStream, 1, b.cfg.singleReps, 0, b.cfg.singleGap)
			return f.IOP.Tokens, err
		}); err != nil {
			return err
		}
		a.r.Single = f
	}
	return nil
}

// concurrent is workload 2. The IOP processes' peak memory is reset
// before each iop half and read after it, so that it is this load's; with
// -profile, perf records the IOP processes during the iop half.
func (b *bench) concurrent(ctx context.Context) error {
	spread := time.Duration(b.cfg.tokens) * b.cfg.tokenDelay
	for _, a := range b.apis {
		f := &pair[streamsFigures]{}
		var err error
		if f.Direct, err = streams(ctx, b.c, b.s.fake, b.direct, modelStream, b.cfg.streams, b.cfg.streamReps, spread, 0); err != nil {
			return err
		}
		procs := b.procs(a)
		mainStack := !a.side.api.Floor // the whole run's peaks are the main stack's
		if mainStack {
			b.foldPeaks(procs)
		}
		resetErr := resetPeaks(procs)
		if resetErr != nil {
			b.res.note("could not reset the peak resident set before workload 2 (%s): %v; its peak RSS is since each process started", a.side.name, resetErr)
		}
		var prof *perfRun
		if b.cfg.profile != "" {
			prof = startPerf(ctx, b.cfg.profile, a.side.api.Key, procs, profileWindow, b.res)
		}
		err = b.onIOP(a, 2, func() (int, error) {
			f.IOP, err = streams(ctx, b.c, b.s.fake, a.side, modelStream, b.cfg.streams, b.cfg.streamReps, spread, 0)
			return f.IOP.Tokens, err
		})
		if prof != nil {
			b.res.Profiles = append(b.res.Profiles, prof.stop(ctx)...)
		}
		if err != nil {
			return err
		}
		rss := readPeaks(procs)
		rss.Reset = resetErr == nil
		a.r.Concurrent, a.r.ConcurrentRSS = f, &rss
		if mainStack {
			b.foldPeaks(procs)
		}
	}
	return nil
}

// long is workload 3.
func (b *bench) long(ctx context.Context) error {
	for _, a := range b.apis {
		f := &pair[longFigures]{}
		var err error
		if f.Direct, _, err = long(ctx, b.c, b.direct, modelLong, b.cfg.longReps); err != nil {
			return err
		}
		if err := b.onIOP(a, 3, func() (int, error) {
			var tokens int
			f.IOP, tokens, err = long(ctx, b.c, a.side, modelLong, b.cfg.longReps)
			return tokens, err
		}); err != nil {
			return err
		}
		a.r.Long = f
	}
	return nil
}

// prefill is workload 4. Every side runs at once (the prefill is idle
// time), and the Node must keep its ready generation throughout.
func (b *bench) prefill(ctx context.Context) error {
	before, err := b.s.nodeState(ctx)
	if err != nil {
		return err
	}
	sides := []side{b.direct}
	for _, a := range b.apis {
		sides = append(sides, a.side)
	}
	figs := make([]prefillFigures, len(sides))
	var errs onceErr
	var wg sync.WaitGroup
	for i, sd := range sides {
		wg.Go(func() {
			r, err := stream(ctx, b.c, sd, modelPrefill, "prefill "+sd.name, false)
			errs.set(err)
			figs[i] = prefillFigures{TTFB: r.ttfb, Done: r.done && err == nil}
		})
	}
	wg.Wait()
	if err := cmp.Or(ctx.Err(), errs.get()); err != nil {
		return err
	}
	after, err := b.s.nodeState(ctx)
	if err != nil {
		return err
	}
	for i, a := range b.apis {
		a.r.Prefill = &pair[prefillFigures]{Direct: figs[0], IOP: figs[i+1]}
	}
	kept := after.State == "ready" && after.Generation == before.Generation
	if p := b.res.Prefill; p != nil { // an earlier API's prefill: both must keep it
		kept = kept && p.NodeKeptGeneration
	}
	b.res.Prefill = &prefillRun{Duration: b.cfg.prefill, NodeKeptGeneration: kept}
	return nil
}

// gone is workload 7.
func (b *bench) gone(ctx context.Context) error {
	for _, a := range b.apis {
		f := &pair[goneFigures]{}
		var err error
		if f.Direct, err = clientGone(ctx, b.c, b.s.fake, b.direct, b.cfg.goneTries); err != nil {
			return err
		}
		if f.IOP, err = clientGone(ctx, b.c, b.s.fake, a.side, b.cfg.goneTries); err != nil {
			return err
		}
		a.r.ClientGone = f
	}
	return nil
}

// foldPeaks keeps the largest VmHWM of each process seen so far.
func (b *bench) foldPeaks(procs []proc) {
	for _, p := range procs {
		if rss, err := peakRSS(fmt.Sprint(p.pid)); err == nil {
			key := fmt.Sprintf("%s\x00%d", p.name, p.pid)
			b.peaks[key] = max(b.peaks[key], rss)
		}
	}
}

// memory records the peak resident set of every process over the run
// (the largest reading of each), at the end.
func (b *bench) memory() {
	procs := b.s.iopProcs()
	b.foldPeaks(procs)
	for _, p := range procs {
		if rss := b.peaks[fmt.Sprintf("%s\x00%d", p.name, p.pid)]; rss > 0 {
			b.res.Memory = append(b.res.Memory, memFigure{Process: p.name, PeakRSS: rss})
		}
	}
	if rss, err := peakRSS("self"); err == nil {
		b.res.Memory = append(b.res.Memory, memFigure{Process: "iopbench (client and fake)", PeakRSS: rss})
	}
}

// resetPeaks resets the peak resident set of every process; the error is
// the first that failed.
func resetPeaks(procs []proc) error {
	var first error
	for _, p := range procs {
		if err := resetPeak(p.pid); err != nil && first == nil {
			first = fmt.Errorf("%s (pid %d): %w", p.name, p.pid, err)
		}
	}
	return first
}

// readPeaks reads the peak resident set of every process, summed by
// process name (a stack may run several plugins of one adapter).
func readPeaks(procs []proc) rssFigures {
	var f rssFigures
	for _, p := range procs {
		if rss, err := peakRSS(fmt.Sprint(p.pid)); err == nil { // a process gone is checkAlive's to report
			f.add(p.name, rss)
		}
	}
	return f
}
