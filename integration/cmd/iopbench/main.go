// Command iopbench measures what IOP adds to a model server's answers, the
// same way, in the same run, straight to the provider ("direct") and
// through IOP ("iop"), and prints the figures beside the performance targets
// of issue 4:
//
//	go run ./integration/cmd/iopbench            # the full run, a few minutes
//	go run ./integration/cmd/iopbench -quick     # CI-sized
//	go run ./integration/cmd/iopbench -out r.json
//
// It builds edged and noded, starts a fake Ollama (internal/fakes/fakeollama) in
// this process on 127.0.0.1, then `edged run` and `noded run` as processes
// with loopback configs (anonymous API, one Node whose ollama provider has
// capacity 64 and points at the fake), and waits until the Node is ready.
// The iop side is POST /api/chat on the Edge: Edge → QUIC stream → Node →
// gRPC → ollama plugin process → fake, and back through the raw provider
// tunnel; the direct side is the same request to the fake. The workloads:
//
//  1. one stream at a time, 200 tokens 5 ms apart, 50 times: time to first
//     byte (request sent → first token line; p50, p99) and streamed tokens
//     per second (all tokens / wall time). Two figures help to read them:
//     the request leg (request sent → the fake has it, from the fake's
//     records) and the provider's answer time (the fake's own start to
//     end, which a busy machine stretches);
//  2. the same with 64 concurrent streams, closed loop, their starts spread
//     over one answer's length so that 64 are always in flight;
//  3. one long stream of 20,000 tokens written as fast as the fake can:
//     tokens per second, and the largest gap between two consecutive lines
//     at the client (tokens are flushed one by one, not batched);
//  4. a long prefill (20 s, standing in for a ten-minute one): the answer
//     ends with its normal terminal, the Node stays ready on the same
//     generation, and the time to first byte added;
//  5. CPU per relayed token: utime+stime from /proc/PID/stat (every thread,
//     also exited ones) of edged, noded and each plugin child, summed over
//     the iop halves of workloads 1–3, divided by the tokens relayed;
//  6. peak memory: VmHWM from /proc/PID/status of edged, noded, each plugin
//     and the bench itself (client and fake);
//  7. client gone: a stream cancelled after three tokens; the time until the
//     fake records that its client went away (p50 over 20 tries).
//
// All processes share this machine (the targets assume 2 cores): the bench's
// client and fake compete with IOP for the CPU, on both sides alike. The
// figures are measured, never asserted: iopbench exits 0 whatever they are,
// and non-zero only when something broke. Every process it started is
// stopped on exit, also on SIGINT.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// config sizes the workloads.
type config struct {
	quick      bool
	capacity   int           // the provider's capacity; also the Edge's queue depth
	tokens     int           // per answer, workloads 1 and 2
	tokenDelay time.Duration // between two tokens, workloads 1, 2, 4 and 7
	singleReps int           // answers in workload 1
	streams    int           // concurrent streams in workload 2
	streamReps int           // answers per stream in workload 2
	longTokens int           // tokens of the long stream, workload 3
	longReps   int           // long streams (the median rate is kept)
	prefill    time.Duration // workload 4
	goneTries  int           // workload 7
	only       string        // comma-separated workload numbers to run; "" runs all
}

// runs reports whether workload n is to run.
func (c config) runs(n string) bool {
	return c.only == "" || n == "warm-up" || slices.Contains(strings.Split(c.only, ","), n)
}

var (
	fullConfig = config{capacity: 64, tokens: 200, tokenDelay: 5 * time.Millisecond,
		singleReps: 50, streams: 64, streamReps: 10, longTokens: 20000, longReps: 3,
		prefill: 20 * time.Second, goneTries: 20}
	quickConfig = config{quick: true, capacity: 64, tokens: 200, tokenDelay: 5 * time.Millisecond,
		singleReps: 10, streams: 64, streamReps: 2, longTokens: 20000, longReps: 1,
		prefill: 3 * time.Second, goneTries: 5}
)

func main() {
	quick := flag.Bool("quick", false, "a CI-sized run: fewer repetitions, a 3 s prefill")
	out := flag.String("out", "", "also write the results as JSON to this file")
	only := flag.String("only", "", "run only these workloads, e.g. 2 or 1,3 (the warm-up always runs); for profiling one load")
	flag.Parse()
	cfg := fullConfig
	if *quick {
		cfg = quickConfig
	}
	cfg.only = *only
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, cfg, os.Stderr)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "iopbench: interrupted; every process it started is stopped")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "iopbench:", err)
		os.Exit(1)
	}
	res.print(os.Stdout)
	if *out != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "iopbench:", err)
			os.Exit(1)
		}
	}
}

// run builds and starts the stack, runs every workload on both sides, and
// stops everything it started. Progress goes to log.
func run(ctx context.Context, cfg config, log io.Writer) (_ *results, err error) {
	dir, err := os.MkdirTemp("", "iopbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(log, "building edged and noded…")
	edged, noded, err := buildBinaries(ctx, dir)
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(log, "starting the fake Ollama, edged and noded…")
	s, err := startStack(ctx, dir, edged, noded, cfg.capacity, fakeModels(cfg))
	if err != nil {
		return nil, err
	}
	defer s.close()
	defer func() {
		if err != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w\nedged log ends:\n%s\nnoded log ends:\n%s", err, s.edge.tail(), s.node.tail())
		}
	}()
	c := &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 2 * cfg.capacity, DisableCompression: true,
	}}
	defer c.CloseIdleConnections()
	if err := s.probe(ctx, c, modelProbe); err != nil {
		return nil, err
	}
	b := &bench{cfg: cfg, s: s, c: c,
		direct: side{name: "direct", base: s.fake.URL()},
		iop:    side{name: "iop", base: s.base},
		res:    &results{Quick: cfg.quick, CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), Config: cfg.export()},
	}
	for _, w := range []struct {
		n, name string
		run     func(context.Context) error
	}{
		{"warm-up", "warm-up", b.warm},
		{"1", fmt.Sprintf("1: one stream, %d answers of %d tokens %v apart", cfg.singleReps, cfg.tokens, cfg.tokenDelay), b.single},
		{"2", fmt.Sprintf("2: %d concurrent streams, %d answers each", cfg.streams, cfg.streamReps), b.concurrent},
		{"3", fmt.Sprintf("3: one long stream of %d tokens, no delay, %d times", cfg.longTokens, cfg.longReps), b.long},
		{"4", fmt.Sprintf("4: a %v prefill", cfg.prefill), b.prefill},
		{"7", fmt.Sprintf("7: client gone mid-stream, %d tries", cfg.goneTries), b.gone},
	} {
		if !cfg.runs(w.n) {
			continue
		}
		fmt.Fprintln(log, "workload", w.name)
		start := time.Now()
		if err := w.run(ctx); err != nil {
			return nil, fmt.Errorf("workload %s: %w", w.name, err)
		}
		if err := s.checkAlive(); err != nil {
			return nil, err
		}
		s.fake.Reset() // the fake keeps every request; free them
		fmt.Fprintf(log, "  done in %v\n", time.Since(start).Round(time.Millisecond))
	}
	b.memory()
	b.res.evaluate()
	return b.res, nil
}

// bench runs the workloads against one stack and fills res.
type bench struct {
	cfg         config
	s           *stack
	c           *http.Client
	direct, iop side
	res         *results
}

// onIOP runs fn (the iop half of a workload), and charges the CPU the IOP
// processes used meanwhile to workload w (1–3) with the tokens fn relayed.
func (b *bench) onIOP(w int, fn func() (tokens int, err error)) error {
	procs := b.s.iopProcs()
	before := sampleCPU(procs)
	tokens, err := fn()
	used := cpuSince(before, procs)
	if err != nil {
		return err
	}
	cw := cpuWorkload{Workload: w, Tokens: tokens, ByProcess: map[string]time.Duration{}}
	for _, p := range procs {
		cw.ByProcess[p.name] += used[p.pid]
		cw.Total += used[p.pid]
	}
	b.res.CPU.Workloads = append(b.res.CPU.Workloads, cw)
	return nil
}

func (b *bench) warm(ctx context.Context) error {
	for _, sd := range []side{b.direct, b.iop} {
		if err := warm(ctx, b.c, sd, b.cfg.streams); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) single(ctx context.Context) error {
	var err error
	if b.res.Single.Direct, err = streams(ctx, b.c, b.s.fake, b.direct, modelStream, 1, b.cfg.singleReps, 0); err != nil {
		return err
	}
	return b.onIOP(1, func() (int, error) {
		b.res.Single.IOP, err = streams(ctx, b.c, b.s.fake, b.iop, modelStream, 1, b.cfg.singleReps, 0)
		return b.res.Single.IOP.Tokens, err
	})
}

func (b *bench) concurrent(ctx context.Context) error {
	spread := time.Duration(b.cfg.tokens) * b.cfg.tokenDelay
	var err error
	if b.res.Concurrent.Direct, err = streams(ctx, b.c, b.s.fake, b.direct, modelStream, b.cfg.streams, b.cfg.streamReps, spread); err != nil {
		return err
	}
	return b.onIOP(2, func() (int, error) {
		b.res.Concurrent.IOP, err = streams(ctx, b.c, b.s.fake, b.iop, modelStream, b.cfg.streams, b.cfg.streamReps, spread)
		return b.res.Concurrent.IOP.Tokens, err
	})
}

func (b *bench) long(ctx context.Context) error {
	var err error
	if b.res.Long.Direct, _, err = long(ctx, b.c, b.direct, modelLong, b.cfg.longReps); err != nil {
		return err
	}
	return b.onIOP(3, func() (int, error) {
		var tokens int
		b.res.Long.IOP, tokens, err = long(ctx, b.c, b.iop, modelLong, b.cfg.longReps)
		return tokens, err
	})
}

// prefill runs both sides at once (the prefill is idle time), and checks
// that the Node kept its ready generation throughout.
func (b *bench) prefill(ctx context.Context) error {
	before, err := b.s.nodeState(ctx)
	if err != nil {
		return err
	}
	var errs onceErr
	var wg sync.WaitGroup
	for _, sd := range []side{b.direct, b.iop} {
		wg.Go(func() {
			r, err := stream(ctx, b.c, sd, modelPrefill, "prefill "+sd.name)
			errs.set(err)
			f := prefillFigures{TTFB: r.ttfb, Done: r.done && err == nil}
			if sd.name == "direct" {
				b.res.Prefill.Direct = f
			} else {
				b.res.Prefill.IOP = f
			}
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
	b.res.Prefill.Duration = b.cfg.prefill
	b.res.Prefill.NodeKeptGeneration = after.State == "ready" && after.Generation == before.Generation
	return nil
}

func (b *bench) gone(ctx context.Context) error {
	var err error
	if b.res.ClientGone.Direct, err = clientGone(ctx, b.c, b.s.fake, b.direct, b.cfg.goneTries); err != nil {
		return err
	}
	b.res.ClientGone.IOP, err = clientGone(ctx, b.c, b.s.fake, b.iop, b.cfg.goneTries)
	return err
}

// memory reads the peak resident set of every process, at the end.
func (b *bench) memory() {
	for _, p := range b.s.iopProcs() {
		if rss, err := peakRSS(fmt.Sprint(p.pid)); err == nil {
			b.res.Memory = append(b.res.Memory, memFigure{Process: p.name, PeakRSS: rss})
		}
	}
	if rss, err := peakRSS("self"); err == nil {
		b.res.Memory = append(b.res.Memory, memFigure{Process: "iopbench (client and fake)", PeakRSS: rss})
	}
}
