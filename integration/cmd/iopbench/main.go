// Command iopbench measures what IOP adds to a model server's answers, the
// same way, in the same run, straight to the provider ("direct") and
// through IOP, for each of the Edge's two chat APIs, and prints the figures
// beside the performance targets of issue 14, and of issue 25 where they
// differ (the tunnel beside its peers):
//
//	go run ./integration/cmd/iopbench            # the full run, about 10 minutes
//	go run ./integration/cmd/iopbench -quick     # CI-sized, about 2 minutes
//	go run ./integration/cmd/iopbench -out r.json
//	go run ./integration/cmd/iopbench -only 2 -apis openai -profile /tmp/prof
//
// It builds edged and noded, starts a fake Ollama (internal/fakes/fakeollama)
// in this process on 127.0.0.1 (whose records give the provider's view),
// then `edged run` and `noded run` as processes with loopback configs
// (anonymous API, one Node whose ollama provider has capacity 64 and points
// at the fake), and waits until the Node is ready. Each workload's requests go through IOP with each API:
//
//   - ollama (tunnel): POST /api/chat on the Edge, relayed as is through the
//     raw provider tunnel of the Node's ollama provider (Edge → QUIC stream
//     → Node → fake, with or without the plugin process on the byte path),
//     and the fake's NDJSON lines back byte for byte;
//   - openai (normalized): POST /v1/chat/completions with "stream": true, a
//     normalized run: the plugin turns it into an Ollama /api/chat call, and
//     the Edge writes its events as SSE chunks. Its tokens are counted from
//     the chunks' content deltas (one per token), and its time to first
//     byte ends at the first content delta.
//
// The direct side is always Ollama's /api/chat on the fake, measured just
// before each API's iop half, so that the two see the machine alike. Each
// API's workloads run together, the tunnel's first: a normalized run starts
// the provider's plugin, which stays up for its idle_stop, and the
// tunnel's figures are those of a Node that only relays.
//
// Then the floor (-apis floor, on by default): workloads 1 and 2 through
// quicfloor (integration/cmd/quicfloor), a bare TCP-over-QUIC relay of two
// processes over quic-go with IOP's QUIC configuration and no IOP code,
// with a direct half of its own just before. What it adds is what the
// transport costs on this machine; the report sets the tunnel's figures
// beside it, so a run tells IOP's own part of a figure from the part no
// relay over quic-go avoids (issue 25). The workloads:
//
//  1. one stream at a time, 200 tokens 5 ms apart, 50 times: time to first
//     byte (request sent → first token; p50, p99) and streamed tokens per
//     second (all tokens / wall time). Two figures help to read them: the
//     request leg (request sent → the fake has it, from the fake's records)
//     and the provider's answer time (the fake's own start to end, which a
//     busy machine stretches);
//  2. the same with 64 concurrent streams, closed loop, their starts spread
//     over one answer's length so that 64 are always in flight. Also the
//     CPU per relayed token (5) and the peak resident set of the IOP
//     processes during this load alone (6); with -profile DIR, a perf
//     profile of each IOP process during it (below);
//  3. one long stream of 20,000 tokens written as fast as the fake can
//     (3 times): tokens per second, and the largest gap between two
//     consecutive tokens at the client;
//  4. a long prefill (20 s, standing in for a ten-minute one), direct and
//     the API's side at once: the answer ends with its normal terminal, the
//     Node stays ready on the same generation, and the time to first byte
//     added;
//  5. CPU per relayed token: utime+stime from /proc/PID/stat (every thread,
//     also exited ones) of edged, noded and each plugin child, over the iop
//     half of each of workloads 1–3, divided by the tokens relayed; by
//     process, and summed (the target is workload 2's sum);
//  6. peak memory: VmHWM from /proc/PID/status. For workload 2's iop halves
//     each IOP process's peak is reset first (writing "5" to
//     /proc/PID/clear_refs) and read after, summed over the processes; and
//     the peak over the whole run of each process and of the bench itself
//     (client and fake);
//  7. client gone: a stream cancelled after three tokens; the time until the
//     fake records that its client went away (p50 and max over 20 tries);
//  8. scale, runs in silent prefill: 10,000 runs at once on one Node link,
//     each waiting out a 30 s prefill, then 4 tokens and the terminal. Every
//     one must complete normally; the report gives completed and failed
//     (with the first error messages verbatim), the most requests the fake
//     held at once and how long it took to have them all (the prefill must
//     outlast that ramp for all to be in flight together), the peak resident
//     set of edged, noded and the plugins (reset before, read after), the
//     CPU per run, and the Node's heartbeat round trip as the Edge's admin
//     API shows it (GET /admin/v1/nodes every 500 ms, last_heartbeat_rtt_ms
//     of the heartbeats answered during the workload: max and p99; the
//     Edge heartbeats every 30 s, so a full run sees one or two), and
//     whether the Node stayed ready, not suspect, on its generation;
//  9. scale, streams: 1,000 streams at once, a token every 100 ms for 60 s:
//     nothing lost, every stream gets every token of its answer in order and
//     its terminal; tokens expected and received, failures, the largest gap
//     between tokens, CPU per token by process, peak resident set summed,
//     and the heartbeat as in 8.
//
// Workloads 8 and 9 run after the others, through each API (normalized
// runs first), each on a fresh stack sized for it: as many ollama providers
// on the one Node as capacity needs (at most 4,096 each, every one its own
// plugin process), the Edge's limits.max_connections and queue above the
// concurrency, and the fake as its own process (fakeollama/cmd), so that
// this one holds only the client's end of each connection. This process
// raises RLIMIT_NOFILE, the hard limit too when it may (the daemons and the
// fake inherit it), and says so in the notes when it could not. They have
// no direct side. -quick runs them at 1,000 runs and 200 streams for 10 s;
// -scale-runs, -scale-prefill, -scale-streams, -scale-duration and
// -scale-gap set their sizes.
//
// With -profile DIR, perf (`perf record -g -p PID`, the cpu-clock event)
// records each IOP process for up to 10 s of workload 2's iop half through
// each API, into DIR/<api>-<process>.perf.data, and the top 25 of
// `perf report --no-children --sort sym` go to DIR/<api>-<process>.txt.
// Its overhead is in that run's figures of workload 2. The daemons are
// then built with their symbol tables, so that perf names their
// functions (their text is laid out as shipped).
//
// All processes share this machine (the targets assume 2 cores): the bench's
// client and fake compete with IOP for the CPU, on both sides alike. The
// figures are measured, never asserted: iopbench exits 0 whatever they are,
// and non-zero only when something broke (a daemon exited, the stack did not
// start). Failed requests are figures, reported with their errors and the
// end of the daemons' logs. Every process it started is stopped on exit,
// also on SIGINT.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

// config sizes the workloads.
type config struct {
	quick      bool
	apis       []apiSpec     // the Edge's APIs measured, in order
	capacity   int           // the provider's capacity; also the Edge's queue depth
	tokens     int           // per answer, workloads 1 and 2
	tokenDelay time.Duration // between two tokens, workloads 1, 2, 4 and 7
	singleReps int           // answers in workload 1
	singleGap  time.Duration // workload 1: from one answer's end to the next request
	streams    int           // concurrent streams in workload 2
	streamReps int           // answers per stream in workload 2
	longTokens int           // tokens of the long stream, workload 3
	longReps   int           // long streams (the median rate is kept)
	prefill    time.Duration // workload 4
	goneTries  int           // workload 7

	scaleRuns     int           // workload 8: runs at once
	scalePrefill  time.Duration // workload 8: the fake's prefill
	scaleStreams  int           // workload 9: streams at once
	scaleDuration time.Duration // workload 9: each stream's length
	scaleGap      time.Duration // workload 9: between two tokens

	only    string // comma-separated workload numbers to run; "" runs all
	profile string // directory for perf profiles of workload 2; "" takes none
}

// runs reports whether workload n is to run.
func (c config) runs(n string) bool {
	return c.only == "" || n == "warm-up" || slices.Contains(strings.Split(c.only, ","), n)
}

// mainWorkloads are those of the main stack.
var mainWorkloads = []string{"1", "2", "3", "4", "7"}

var (
	fullConfig = config{apis: allAPIs, capacity: 64, tokens: 200, tokenDelay: 5 * time.Millisecond,
		singleReps: 50, streams: 64, streamReps: 10, longTokens: 20000, longReps: 3,
		prefill: 20 * time.Second, goneTries: 20,
		scaleRuns: 10000, scalePrefill: 30 * time.Second,
		scaleStreams: 1000, scaleDuration: time.Minute, scaleGap: 100 * time.Millisecond}
	quickConfig = config{quick: true, apis: allAPIs, capacity: 64, tokens: 200, tokenDelay: 5 * time.Millisecond,
		singleReps: 10, streams: 64, streamReps: 2, longTokens: 20000, longReps: 1,
		prefill: 3 * time.Second, goneTries: 5,
		scaleRuns: 1000, scalePrefill: 5 * time.Second,
		scaleStreams: 200, scaleDuration: 10 * time.Second, scaleGap: 100 * time.Millisecond}
)

func main() {
	quick := flag.Bool("quick", false, "a CI-sized run: fewer repetitions, a 3 s prefill, scale workloads at 1,000 runs and 200 streams")
	out := flag.String("out", "", "also write the results as JSON to this file")
	only := flag.String("only", "", "run only these workloads, e.g. 2 or 1,3 or 8,9 (the warm-up always runs); for profiling one load")
	apis := flag.String("apis", "ollama,openai,floor", "what to measure, in order: ollama (the Edge's raw tunnel), openai (normalized runs), floor (a bare quic-go relay, workloads 1 and 2)")
	profile := flag.String("profile", "", "record perf profiles of edged, noded and each plugin during workload 2's iop halves into this directory")
	scaleRuns := flag.Int("scale-runs", 0, "workload 8: runs at once (default 10000; 1000 with -quick)")
	scalePrefill := flag.Duration("scale-prefill", 0, "workload 8: the provider's silent prefill, longer than the ramp (default 30s; 5s with -quick)")
	scaleStreams := flag.Int("scale-streams", 0, "workload 9: streams at once (default 1000; 200 with -quick)")
	scaleDuration := flag.Duration("scale-duration", 0, "workload 9: each stream's length (default 1m; 10s with -quick)")
	scaleGap := flag.Duration("scale-gap", 0, "workload 9: between two tokens (default 100ms)")
	tokenDelay := flag.Duration("token-delay", -1, "workloads 1 and 2: between two tokens of an answer (default 5ms); 0 answers in a burst, back to back (issue 25)")
	singleReps := flag.Int("single-reps", 0, "workload 1: answers, one at a time (default 50)")
	singleGap := flag.Duration("single-gap", 0, "workload 1: from one answer's end to the next request, as an agent's session runs a tool between two (default 0: at once)")
	flag.Parse()
	cfg := fullConfig
	if *quick {
		cfg = quickConfig
	}
	cfg.only, cfg.profile = *only, *profile
	cfg.apis = nil
	for key := range strings.SplitSeq(*apis, ",") {
		a, ok := apiByKey(strings.TrimSpace(key))
		if !ok {
			fmt.Fprintf(os.Stderr, "iopbench: -apis: no API %q (ollama, openai, floor)\n", key)
			os.Exit(2)
		}
		cfg.apis = append(cfg.apis, a)
	}
	setIf(&cfg.scaleRuns, *scaleRuns)
	setIf(&cfg.scalePrefill, *scalePrefill)
	setIf(&cfg.scaleStreams, *scaleStreams)
	setIf(&cfg.scaleDuration, *scaleDuration)
	setIf(&cfg.scaleGap, *scaleGap)
	setIf(&cfg.singleReps, *singleReps)
	setIf(&cfg.singleGap, *singleGap)
	if *tokenDelay >= 0 {
		cfg.tokenDelay = *tokenDelay
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, cfg, os.Stderr)
	if res != nil {
		res.print(os.Stdout)
		if *out != "" {
			b, _ := json.MarshalIndent(res, "", "  ")
			if werr := os.WriteFile(*out, append(b, '\n'), 0o644); werr != nil {
				err = errors.Join(err, werr)
			}
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "iopbench: interrupted; every process it started is stopped")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "iopbench:", err)
		os.Exit(1)
	}
}

// setIf sets *v to flag when the flag was given (not zero).
func setIf[T comparable](v *T, flag T) {
	var zero T
	if flag != zero {
		*v = flag
	}
}

// run builds the daemons, runs the main stack's workloads then the scale
// workloads, and stops everything it started. Progress goes to log. The
// results are nil only when nothing could be measured; with an error
// beside them, they are what was measured before the stack broke.
func run(ctx context.Context, cfg config, log io.Writer) (*results, error) {
	res := &results{Quick: cfg.quick, CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), Config: cfg.export()}
	dir, err := os.MkdirTemp("", "iopbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	// The scale workloads hold a client connection per request here (their
	// fake runs as its own process, which inherits the limit, as the
	// daemons do).
	wantFDs := uint64(cfg.scaleConcurrency() + 4096)
	fdLimit, err := raiseFDLimit(wantFDs)
	if err != nil {
		res.note("could not raise RLIMIT_NOFILE to %d: %v; it is %d, so the scale workloads may fail for lack of file descriptors",
			wantFDs, err, fdLimit)
	}
	fmt.Fprintln(log, "building edged and noded…")
	scale := cfg.runs("8") || cfg.runs("9")
	bins, err := buildBinaries(ctx, dir, buildOptions{fake: scale, symbols: cfg.profile != "",
		floor: slices.ContainsFunc(cfg.apis, func(a apiSpec) bool { return a.Floor })})
	if err != nil {
		return nil, err
	}
	if slices.ContainsFunc(mainWorkloads, cfg.runs) {
		if err := runMain(ctx, cfg, dir, bins, res, log); err != nil {
			return nil, err
		}
	}
	if scale {
		if err := runScale(ctx, cfg, dir, bins, res, fdLimit, log); err != nil {
			res.evaluate()
			return res, err
		}
	}
	res.evaluate()
	return res, nil
}

// runMain starts the main stack, runs workloads 1–4 and 7 on it through
// every API, and stops it.
func runMain(ctx context.Context, cfg config, dir string, bins binaries, res *results, log io.Writer) (err error) {
	fmt.Fprintln(log, "starting the fake Ollama, edged and noded…")
	s, err := startStack(ctx, dir, bins, stackOptions{name: "main", models: fakeModels(cfg),
		providers: 1, capacity: cfg.capacity, queueDepth: cfg.capacity, deadline: 10 * time.Minute, idle: 2 * time.Minute})
	if err != nil {
		return err
	}
	defer s.close()
	defer func() {
		if err != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w\nedged log ends:\n%s\nnoded log ends:\n%s", err, s.edge.tail(), s.node.tail())
		}
	}()
	var fl *floor
	if bins.floor != "" {
		fmt.Fprintln(log, "starting quicfloor…")
		if fl, err = startFloor(ctx, dir, bins.floor, s.fakeURL); err != nil {
			return err
		}
		defer fl.close()
	}
	c := &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 2 * cfg.capacity, DisableCompression: true,
	}}
	defer c.CloseIdleConnections()
	b := newBench(cfg, s, fl, c, res, log)
	workloads := []struct {
		n, name string
		run     func(context.Context) error
	}{
		{"warm-up", "warm-up", b.warm},
		{"1", fmt.Sprintf("1: one stream, %d answers of %d tokens %v apart%s", cfg.singleReps, cfg.tokens, cfg.tokenDelay, gapNote(cfg.singleGap)), b.single},
		{"2", fmt.Sprintf("2: %d concurrent streams, %d answers each", cfg.streams, cfg.streamReps), b.concurrent},
		{"3", fmt.Sprintf("3: one long stream of %d tokens, no delay, %d times", cfg.longTokens, cfg.longReps), b.long},
		{"4", fmt.Sprintf("4: a %v prefill", cfg.prefill), b.prefill},
		{"7", fmt.Sprintf("7: client gone mid-stream, %d tries", cfg.goneTries), b.gone},
	}
	// Each API's workloads run together, in cfg.apis's order (the tunnel's
	// first by default), each API probed just before its own. A normalized
	// run starts the provider's plugin, which then stays up for its
	// idle_stop: run between them, or probed ahead, the tunnel's figures
	// would count a process that a Node only relaying never runs (issue
	// 25).
	all := b.apis
	for _, a := range all {
		if !a.side.api.Floor { // the floor's start waited for its connection
			if err := s.probe(ctx, c, modelProbe, []apiSpec{a.side.api}); err != nil {
				return err
			}
		}
		b.apis = []apiRun{a}
		for _, w := range workloads {
			if !cfg.runs(w.n) || a.side.api.Floor && !floorWorkloads[w.n] {
				continue
			}
			fmt.Fprintf(log, "workload %s (%s)\n", w.name, a.side.name)
			start := time.Now()
			if err := w.run(ctx); err != nil {
				return fmt.Errorf("workload %s (%s): %w", w.name, a.side.name, err)
			}
			if err := s.checkAlive(); err != nil {
				return err
			}
			if fl != nil {
				if err := fl.checkAlive(); err != nil {
					return err
				}
			}
			s.fake.Reset() // the fake keeps every request; free them
			fmt.Fprintf(log, "  done in %v\n", time.Since(start).Round(time.Millisecond))
		}
	}
	b.memory()
	return nil
}

// gapNote says how long workload 1's client waits between two answers,
// when it does.
func gapNote(gap time.Duration) string {
	if gap <= 0 {
		return ""
	}
	return fmt.Sprintf(", %v between an answer and the next request", gap)
}
