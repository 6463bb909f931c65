package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/internal/node/nodeconfig"
)

// The scale workloads run on a stack of their own, started after the main
// one is stopped: its provider capacity, the Edge's connection limit and
// queue are sized for them, and their peaks are not the main stack's.
const (
	modelScalePrefill = "bench-scale-prefill:latest" // workload 8
	modelScaleStream  = "bench-scale-stream:latest"  // workload 9
	// scaleAnswerTokens is the length of workload 8's answers, after the
	// prefill.
	scaleAnswerTokens = 4
	// scaleErrors is how many error messages a scale workload keeps.
	scaleErrors = 5
	// heartbeatPoll is how often the admin API is read during a scale
	// workload.
	heartbeatPoll = 500 * time.Millisecond
)

// scaleConcurrency is the most requests the scale workloads hold at once.
func (c config) scaleConcurrency() int {
	n := 0
	if c.runs("8") {
		n = max(n, c.scaleRuns)
	}
	if c.runs("9") {
		n = max(n, c.scaleStreams)
	}
	return n
}

// scaleStack sizes a stack for n requests at once: enough ollama providers
// of at most nodeconfig.MaxCapacity on the one Node (each its own plugin
// process) for every request to hold a slot, an Edge that accepts that
// many client connections and more, and a queue as deep, should a slot be
// freed late.
func scaleStack(cfg config, name string, n int) stackOptions {
	providers := (n + nodeconfig.MaxCapacity - 1) / nodeconfig.MaxCapacity
	return stackOptions{
		name: name,
		models: []fakeollama.Model{
			{Name: modelProbe, TokenCount: 1},
			{Name: modelScalePrefill, TokenCount: scaleAnswerTokens, PrefillDelay: cfg.scalePrefill, Seed: 5},
			{Name: modelScaleStream, TokenCount: cfg.scaleTokens(), TokenDelay: cfg.scaleGap, Seed: 6},
		},
		providers:   providers,
		capacity:    (n + providers - 1) / providers,
		maxConns:    n + 1024,
		queueDepth:  n,
		deadline:    max(10*time.Minute, cfg.scalePrefill+cfg.scaleDuration+5*time.Minute),
		idle:        cfg.scalePrefill + 2*time.Minute,
		fakeProcess: true,
	}
}

// scaleTokens is the length of workload 9's answers.
func (c config) scaleTokens() int { return max(int(c.scaleDuration/c.scaleGap), 1) }

// scaleResults are workloads 8 and 9.
type scaleResults struct {
	FDLimit uint64 `json:"rlimit_nofile"`
	// Runs is workload 8 and Streams workload 9, one entry per API.
	Runs    []scaleRunsFigures    `json:"runs_in_prefill,omitempty"`
	Streams []scaleStreamsFigures `json:"streams,omitempty"`
	// Broken says that a daemon exited during the scale workloads.
	Broken string `json:"broken,omitempty"`
}

// scaleCommon are the figures both scale workloads report.
type scaleCommon struct {
	API string `json:"api"`
	// The stack's size: ollama providers on the one Node, the capacity of
	// each, and the Edge's limits.max_connections.
	Providers int           `json:"providers"`
	Capacity  int           `json:"capacity_each"`
	MaxConns  int           `json:"edge_max_connections"`
	Failed    int           `json:"failed"`
	Errors    []string      `json:"errors,omitempty"` // the first few, verbatim
	Wall      time.Duration `json:"wall_ns"`
	// CPU is what the IOP processes used during the workload.
	CPU cpuWorkload `json:"cpu"`
	// RSS is the peak resident set of the IOP processes, reset before.
	RSS       *rssFigures      `json:"peak_rss,omitempty"`
	Heartbeat heartbeatFigures `json:"heartbeat"`
	// Exited are IOP processes that ended during the workload (a plugin
	// the Node restarted, say).
	Exited []string `json:"exited,omitempty"`
	// EdgeLog and NodeLog end the daemons' logs, when something failed.
	EdgeLog []string `json:"edged_log,omitempty"`
	NodeLog []string `json:"noded_log,omitempty"`
}

// scaleRunsFigures is workload 8 through one API.
type scaleRunsFigures struct {
	scaleCommon
	Runs      int           `json:"runs"`
	Prefill   time.Duration `json:"prefill_ns"`
	Completed int           `json:"completed"`
	// PeakInFlight is the most requests the fake held at once; Ramp is
	// from the first request sent to the fake having the last one.
	PeakInFlight int           `json:"peak_in_flight"`
	Ramp         time.Duration `json:"ramp_ns"`
	// WaitP50 and WaitMax are the time to first token beyond the prefill,
	// of the runs that completed.
	WaitP50 time.Duration `json:"ttfb_beyond_prefill_p50_ns"`
	WaitMax time.Duration `json:"ttfb_beyond_prefill_max_ns"`
	// InFlightError says why the fake's records could not be read.
	InFlightError string `json:"in_flight_error,omitempty"`
}

// scaleStreamsFigures is workload 9 through one API.
type scaleStreamsFigures struct {
	scaleCommon
	Streams        int           `json:"streams"`
	Gap            time.Duration `json:"gap_ns"`
	Duration       time.Duration `json:"duration_ns"`
	TokensExpected int           `json:"tokens_expected"`
	TokensReceived int           `json:"tokens_received"`
	// Complete streams got every token, in order, and their terminal;
	// Altered ones ended normally with text other than the answer's.
	Complete int `json:"complete"`
	Altered  int `json:"altered"`
	// MaxGap is the largest gap between two tokens of any stream; GapP99
	// is the 99th percentile of the streams' largest gaps.
	MaxGap time.Duration `json:"max_gap_ns"`
	GapP99 time.Duration `json:"max_gap_p99_ns"`
}

// scaleRun is one scale workload in progress: what it samples before and
// after, and the errors it collects.
type scaleRun struct {
	s      *stack
	procs  []proc
	cpu    cpuSample
	reset  error
	poller *heartbeatPoller
	start  time.Time

	mu     sync.Mutex
	failed int
	errs   []string
}

func beginScale(ctx context.Context, s *stack) *scaleRun {
	r := &scaleRun{s: s, procs: s.iopProcs()}
	r.reset = resetPeaks(r.procs)
	r.cpu = sampleCPU(r.procs)
	r.poller = startHeartbeatPoller(ctx, s)
	r.start = time.Now()
	return r
}

func (r *scaleRun) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed++
	if len(r.errs) < scaleErrors {
		r.errs = append(r.errs, err.Error())
	}
}

// end stops the sampling and fills the common figures; tokens are those
// relayed (for the CPU per token).
func (r *scaleRun) end(api string, w, tokens int) scaleCommon {
	c := scaleCommon{API: api, Wall: time.Since(r.start), Failed: r.failed, Errors: r.errs}
	c.Heartbeat = r.poller.stop()
	c.CPU = newCPUWorkload(w, tokens, r.procs, cpuSince(r.cpu, r.procs))
	rss := readPeaks(r.procs)
	rss.Reset = r.reset == nil
	c.RSS = &rss
	for _, p := range r.procs {
		if !alive(p.pid) {
			c.Exited = append(c.Exited, fmt.Sprintf("%s (pid %d)", p.name, p.pid))
		}
	}
	if c.Failed > 0 || len(c.Exited) > 0 || !c.Heartbeat.StayedReady {
		c.EdgeLog, c.NodeLog = r.s.edge.tailLines(20), r.s.node.tailLines(20)
	}
	return c
}

// runsInPrefill is workload 8: n runs at once, each waiting out the fake's
// silent prefill, then a short answer with its normal terminal.
func runsInPrefill(ctx context.Context, c *http.Client, s *stack, sd side, n int, prefill time.Duration) scaleRunsFigures {
	f := scaleRunsFigures{Runs: n, Prefill: prefill}
	run := beginScale(ctx, s)
	rctx, cancel := context.WithTimeout(ctx, prefill+5*time.Minute)
	defer cancel()
	var (
		mu    sync.Mutex
		waits []time.Duration
		wg    sync.WaitGroup
	)
	for i := range n {
		wg.Go(func() {
			r, err := stream(rctx, c, sd, modelScalePrefill, fmt.Sprintf("scale %s run %d", sd.api.Key, i), false)
			if err == nil && r.tokens != scaleAnswerTokens {
				err = fmt.Errorf("%s: %d tokens, want %d", sd.name, r.tokens, scaleAnswerTokens)
			}
			if err != nil {
				run.fail(err)
				return
			}
			mu.Lock()
			f.Completed++
			waits = append(waits, r.ttfb-prefill)
			mu.Unlock()
		})
	}
	wg.Wait()
	f.scaleCommon = run.end(sd.api.Key, 8, f.Completed*scaleAnswerTokens)
	if len(waits) > 0 {
		f.WaitP50, f.WaitMax = percentile(waits, 50), slices.Max(waits)
	}
	if reqs, err := s.fakeRequests(ctx); err != nil {
		f.InFlightError = err.Error()
	} else {
		f.PeakInFlight, f.Ramp = inFlight(reqs, run.start)
	}
	return f
}

// inFlight returns the most requests the fake held at once, and the time
// from start to the fake having the last of them.
func inFlight(reqs []fakeollama.Request, start time.Time) (peak int, ramp time.Duration) {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	now := time.Now()
	for _, r := range reqs {
		if r.Path != "/api/chat" || r.Model != modelScalePrefill {
			continue
		}
		end := r.End
		if end.IsZero() {
			end = now
		}
		edges = append(edges, edge{r.Start, 1}, edge{end, -1})
		ramp = max(ramp, r.Start.Sub(start))
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // an end before a start at the same instant
	})
	cur := 0
	for _, e := range edges {
		cur += e.delta
		peak = max(peak, cur)
	}
	return peak, ramp
}

// streamsAtScale is workload 9: n streams at once, each of tokens tokens
// gap apart; their starts are spread over one gap, so that tokens leave
// the fake evenly rather than in bursts. Each stream's text is checked
// against the answer: every token, in order.
func streamsAtScale(ctx context.Context, c *http.Client, s *stack, sd side, n, tokens int, gap time.Duration) scaleStreamsFigures {
	f := scaleStreamsFigures{Streams: n, Gap: gap, Duration: time.Duration(tokens) * gap, TokensExpected: n * tokens}
	var want string
	for _, m := range s.models {
		if m.Name == modelScaleStream {
			want = m.AnswerText()
		}
	}
	run := beginScale(ctx, s)
	rctx, cancel := context.WithTimeout(ctx, f.Duration+5*time.Minute)
	defer cancel()
	var (
		mu   sync.Mutex
		gaps []time.Duration
		wg   sync.WaitGroup
	)
	for i := range n {
		wg.Go(func() {
			select {
			case <-time.After(gap * time.Duration(i) / time.Duration(n)):
			case <-rctx.Done():
				return
			}
			r, err := stream(rctx, c, sd, modelScaleStream, fmt.Sprintf("scale %s stream %d", sd.api.Key, i), true)
			mu.Lock()
			f.TokensReceived += r.tokens
			altered := err == nil && string(r.text) != want
			if altered {
				f.Altered++
			}
			if err == nil && !altered {
				f.Complete++
				gaps = append(gaps, r.maxGap)
			}
			mu.Unlock()
			if altered {
				err = fmt.Errorf("%s: %d tokens, not the answer's %d in order", sd.name, r.tokens, tokens)
			}
			if err != nil {
				run.fail(err)
			}
		})
	}
	wg.Wait()
	f.scaleCommon = run.end(sd.api.Key, 9, f.TokensReceived)
	if len(gaps) > 0 {
		f.MaxGap, f.GapP99 = slices.Max(gaps), percentile(gaps, 99)
	}
	return f
}

// heartbeatFigures is the Node's heartbeat as the Edge's admin API showed
// it during a workload (GET /admin/v1/nodes every heartbeatPoll, field
// last_heartbeat_rtt_ms). The Edge sends a heartbeat every 30 s
// (quicwire.DefaultLiveness), so a workload sees one or two.
type heartbeatFigures struct {
	Polls          int    `json:"polls"`
	PollErrors     int    `json:"poll_errors"`
	FirstPollError string `json:"first_poll_error,omitempty"`
	// Heartbeats is how many heartbeats were answered during the
	// workload; RTTMax and RTTP99 are over the polls that showed one.
	Heartbeats int           `json:"heartbeats"`
	RTTMax     time.Duration `json:"rtt_max_ns"`
	RTTP99     time.Duration `json:"rtt_p99_ns"`
	// MaxAge is the oldest the last answered heartbeat was at a poll: above
	// the interval, one went unanswered for that long.
	MaxAge time.Duration `json:"last_heartbeat_max_age_ns"`
	// SlowestPoll is the admin API's slowest answer.
	SlowestPoll time.Duration `json:"slowest_poll_ns"`
	// StayedReady: every poll found the Node ready, not suspect, on the
	// generation it had when the workload began.
	StayedReady bool     `json:"stayed_ready"`
	Seen        []string `json:"seen,omitempty"` // states other than ready (and suspect) it was found in
}

func (h heartbeatFigures) verdict(target string) verdict {
	v := verdict{Target: target}
	switch {
	case h.Heartbeats == 0:
		v.NotMeasured = true
		v.Measured = "no heartbeat in the window"
		v.Detail = "the Edge heartbeats every 30 s; a longer workload sees one"
	default:
		v.Measured = fmt.Sprintf("max %s over %d heartbeats", ms(h.RTTMax), h.Heartbeats)
		v.Met = h.RTTMax < targetHeartbeatRTT && h.StayedReady
		if !h.StayedReady {
			v.Detail = fmt.Sprintf("the Node did not stay ready: %v", h.Seen)
		} else if v.Met {
			v.Detail = ms(targetHeartbeatRTT-h.RTTMax) + " to spare"
		}
	}
	return v
}

// heartbeatPoller reads the Edge's view of the Node until stopped.
type heartbeatPoller struct {
	cancel context.CancelFunc
	done   chan heartbeatFigures
}

func startHeartbeatPoller(ctx context.Context, s *stack) *heartbeatPoller {
	ctx, cancel := context.WithCancel(ctx)
	p := &heartbeatPoller{cancel: cancel, done: make(chan heartbeatFigures, 1)}
	start := time.Now()
	first, firstErr := s.nodeState(ctx)
	go func() {
		h := heartbeatFigures{StayedReady: firstErr == nil && first.State == "ready"}
		var rtts []time.Duration
		seen := map[time.Time]bool{}
		t := time.NewTicker(heartbeatPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				if len(rtts) > 0 {
					h.RTTMax, h.RTTP99 = slices.Max(rtts), percentile(rtts, 99)
				}
				h.Heartbeats = len(seen)
				p.done <- h
				return
			case <-t.C:
			}
			at := time.Now()
			n, err := s.nodeState(ctx)
			if ctx.Err() != nil {
				continue
			}
			h.Polls++
			h.SlowestPoll = max(h.SlowestPoll, time.Since(at))
			if err != nil {
				h.PollErrors++
				if h.FirstPollError == "" {
					h.FirstPollError = err.Error()
				}
				continue
			}
			state := n.State
			if n.Suspect {
				state += " (suspect)"
			}
			if n.State != "ready" || n.Suspect || n.Generation != first.Generation {
				h.StayedReady = false
				if s := fmt.Sprintf("%s on generation %d", state, n.Generation); !slices.Contains(h.Seen, s) {
					h.Seen = append(h.Seen, s)
				}
			}
			if n.LastHeartbeatAt == nil || n.LastHeartbeatRTTMillis == nil {
				continue
			}
			h.MaxAge = max(h.MaxAge, at.Sub(*n.LastHeartbeatAt))
			if n.LastHeartbeatAt.Before(start) {
				continue // answered before the workload began
			}
			seen[*n.LastHeartbeatAt] = true
			rtts = append(rtts, time.Duration(*n.LastHeartbeatRTTMillis*float64(time.Millisecond)))
		}
	}()
	return p
}

func (p *heartbeatPoller) stop() heartbeatFigures {
	p.cancel()
	return <-p.done
}

// scaleClient is the client of the scale workloads: no cap on connections
// to the Edge, and as many idle ones kept as requests at once.
func scaleClient(n int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: n + 64, DisableCompression: true,
		DialContext: (&net.Dialer{Timeout: time.Minute}).DialContext,
	}}
}

// runScale runs workloads 8 and 9 through each API, each on a stack of its
// own, started for it and sized for it: its peaks and its heartbeats are
// its own. Failed requests are figures; a daemon that exits breaks the run.
func runScale(ctx context.Context, cfg config, dir string, bins binaries, res *results, fdLimit uint64, log io.Writer) error {
	res.Scale = &scaleResults{FDLimit: fdLimit}
	for _, w := range []string{"8", "9"} {
		if !cfg.runs(w) {
			continue
		}
		for _, a := range normalizedFirst(cfg.apis) {
			if err := scaleOnce(ctx, cfg, w, a, dir, bins, res, log); err != nil {
				if res.Scale.Broken == "" {
					res.Scale.Broken = err.Error()
				}
				return err
			}
		}
	}
	return nil
}

// scaleOnce starts a stack, runs workload w (8 or 9) through a on it, and
// stops it.
func scaleOnce(ctx context.Context, cfg config, w string, a apiSpec, dir string, bins binaries, res *results, log io.Writer) error {
	n := cfg.scaleRuns
	if w == "9" {
		n = cfg.scaleStreams
	}
	o := scaleStack(cfg, "scale-"+w+"-"+a.Key, n)
	if total := o.providers * o.capacity; total > nodeconfig.MaxTotalCapacity {
		res.note("workload %s needs %d slots; a Node offers at most %d (noded will refuse the config)", w, total, nodeconfig.MaxTotalCapacity)
	}
	fmt.Fprintf(log, "starting a stack for workload %s (%s): %d ollama provider(s) of capacity %d, Edge max_connections %d…\n",
		w, a.Key, o.providers, o.capacity, o.maxConns)
	s, err := startStack(ctx, dir, bins, o)
	if err != nil {
		return fmt.Errorf("starting the stack for workload %s: %w", w, err)
	}
	defer s.close()
	c := scaleClient(n)
	defer c.CloseIdleConnections()
	if err := s.probe(ctx, c, modelProbe, []apiSpec{a}); err != nil {
		return err
	}
	sd := side{name: a.Label, api: a, base: s.base}
	start := time.Now()
	var common *scaleCommon
	if w == "8" {
		fmt.Fprintf(log, "workload 8: %d concurrent runs in a %v silent prefill, %s\n", cfg.scaleRuns, cfg.scalePrefill, a.Label)
		f := runsInPrefill(ctx, c, s, sd, cfg.scaleRuns, cfg.scalePrefill)
		res.Scale.Runs = append(res.Scale.Runs, f)
		common = &res.Scale.Runs[len(res.Scale.Runs)-1].scaleCommon
		fmt.Fprintf(log, "  %d completed, %d failed\n", f.Completed, f.Failed)
	} else {
		fmt.Fprintf(log, "workload 9: %d streams, a token every %v for %v, %s\n", cfg.scaleStreams, cfg.scaleGap, cfg.scaleDuration, a.Label)
		f := streamsAtScale(ctx, c, s, sd, cfg.scaleStreams, cfg.scaleTokens(), cfg.scaleGap)
		res.Scale.Streams = append(res.Scale.Streams, f)
		common = &res.Scale.Streams[len(res.Scale.Streams)-1].scaleCommon
		fmt.Fprintf(log, "  %d of %d streams whole, %d failed\n", f.Complete, f.Streams, f.Failed)
	}
	common.Providers, common.Capacity, common.MaxConns = o.providers, o.capacity, o.maxConns
	fmt.Fprintf(log, "  done in %v\n", time.Since(start).Round(time.Millisecond))
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return s.checkAlive()
}

// normalizedFirst orders apis for the scale workloads: the runs of issue
// 14's scale targets are normalized runs (the OpenAI API), then the raw
// tunnel. The floor runs no scale workload.
func normalizedFirst(apis []apiSpec) []apiSpec {
	var out []apiSpec
	for _, sse := range []bool{true, false} {
		for _, a := range apis {
			if a.SSE == sse && !a.Floor {
				out = append(out, a)
			}
		}
	}
	return out
}
