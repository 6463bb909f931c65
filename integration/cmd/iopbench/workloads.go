package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// The models the fake serves, one per workload.
const (
	modelProbe   = "bench-probe:latest"   // warm-up: 1 token
	modelStream  = "bench-stream:latest"  // workloads 1 and 2
	modelLong    = "bench-long:latest"    // workload 3
	modelPrefill = "bench-prefill:latest" // workload 4
	modelGone    = "bench-gone:latest"    // workload 7
)

func fakeModels(cfg config) []fakeollama.Model {
	return []fakeollama.Model{
		{Name: modelProbe, TokenCount: 1},
		{Name: modelStream, TokenCount: cfg.tokens, TokenDelay: cfg.tokenDelay, Seed: 1},
		{Name: modelLong, TokenCount: cfg.longTokens, Seed: 2},
		{Name: modelPrefill, TokenCount: 20, TokenDelay: cfg.tokenDelay, PrefillDelay: cfg.prefill, Seed: 3},
		// 100 s at 5 ms a token: it never ends before the client goes.
		{Name: modelGone, TokenCount: 20000, TokenDelay: cfg.tokenDelay, Seed: 4},
	}
}

// streamsFigures are workloads 1 and 2 on one side.
type streamsFigures struct {
	Streams      int           `json:"streams"`
	Answers      int           `json:"answers"`
	Failed       int           `json:"failed"`
	FirstFailure string        `json:"first_failure,omitempty"`
	Tokens       int           `json:"tokens"`
	Wall         time.Duration `json:"wall_ns"`
	TokensPerSec float64       `json:"tokens_per_s"`
	TTFBP50      time.Duration `json:"ttfb_p50_ns"`
	TTFBP99      time.Duration `json:"ttfb_p99_ns"`
	// RequestLegP50 is the part of the time to first byte before the
	// provider had the whole request (request sent → the fake's record of
	// it); the rest is the answer's way back.
	RequestLegP50 time.Duration `json:"request_leg_p50_ns"`
	// ProviderAnswerP50 is how long the fake took to answer (its record's
	// start to end): the provider's own pace, which a busy machine slows.
	ProviderAnswerP50 time.Duration `json:"provider_answer_p50_ns"`
}

// sent is one answer of a streams workload, to be matched with the fake's
// record of it by its prompt.
type sent struct {
	prompt string
	at     time.Time
}

// streams runs workers concurrent closed-loop clients, each streaming reps
// answers of model. Worker i starts i/workers of one answer's length after
// the first, so that the streams are spread in time as in a steady state
// rather than all starting (and ending) in the same millisecond. A stream
// that fails is counted, not fatal: a refusal below capacity is a finding.
func streams(ctx context.Context, c *http.Client, fake *fakeollama.Server, s side, model string, workers, reps int, spread, gap time.Duration) (streamsFigures, error) {
	fake.Reset() // the records of this half alone, for providerView
	f := streamsFigures{Streams: workers}
	var (
		mu    sync.Mutex
		ttfbs []time.Duration
		sents []sent
		wg    sync.WaitGroup
	)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			select {
			case <-time.After(spread * time.Duration(w) / time.Duration(workers)):
			case <-ctx.Done():
				return
			}
			for i := range reps {
				if i > 0 && gap > 0 {
					select { // the client's own time between two answers
					case <-time.After(gap):
					case <-ctx.Done():
					}
				}
				if ctx.Err() != nil {
					return
				}
				prompt := fmt.Sprintf("%s worker %d answer %d", s.name, w, i)
				at := time.Now()
				r, err := stream(ctx, c, s, model, prompt, false)
				mu.Lock()
				f.Answers++
				f.Tokens += r.tokens
				if err != nil {
					f.Failed++
					if f.FirstFailure == "" {
						f.FirstFailure = err.Error()
					}
				} else {
					ttfbs = append(ttfbs, r.ttfb)
					sents = append(sents, sent{prompt, at})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	f.Wall = time.Since(start)
	if err := ctx.Err(); err != nil {
		return f, err
	}
	if len(ttfbs) == 0 {
		return f, fmt.Errorf("%s: every stream failed; the first: %s", s.name, f.FirstFailure)
	}
	f.TokensPerSec = float64(f.Tokens) / f.Wall.Seconds()
	f.TTFBP50, f.TTFBP99 = percentile(ttfbs, 50), percentile(ttfbs, 99)
	f.RequestLegP50, f.ProviderAnswerP50 = providerView(fake, sents)
	return f, nil
}

// providerView matches answers with the fake's records of them, by prompt,
// and returns the median request leg and provider answer time.
func providerView(fake *fakeollama.Server, sents []sent) (requestLeg, answer time.Duration) {
	byPrompt := make(map[string]fakeollama.Request)
	for _, r := range fake.Requests() {
		if r.Path != "/api/chat" {
			continue
		}
		// The prompt is the only message's content, quoted in the body.
		if i := bytes.LastIndex(r.Body, []byte(`"content":"`)); i >= 0 {
			rest := r.Body[i+len(`"content":"`):]
			if j := bytes.IndexByte(rest, '"'); j >= 0 {
				byPrompt[string(rest[:j])] = r
			}
		}
	}
	var legs, answers []time.Duration
	for _, s := range sents {
		if r, ok := byPrompt[s.prompt]; ok && !r.End.IsZero() {
			legs = append(legs, r.Start.Sub(s.at))
			answers = append(answers, r.End.Sub(r.Start))
		}
	}
	if len(legs) == 0 {
		return 0, 0
	}
	return percentile(legs, 50), percentile(answers, 50)
}

// warm sends n concurrent short answers, uncounted: connections on every
// hop are dialled and the plugin's code paths are hot before measuring.
func warm(ctx context.Context, c *http.Client, s side, n int) error {
	var errs onceErr
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, err := stream(ctx, c, s, modelProbe, fmt.Sprint("warm ", s.api.Key, " ", i), false); err != nil {
				errs.set(err)
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errs.get()
}

// longFigures is workload 3 on one side.
type longFigures struct {
	Tokens       int           `json:"tokens"`
	TokensPerSec float64       `json:"tokens_per_s"` // median over the repetitions
	MaxGap       time.Duration `json:"max_gap_ns"`   // the largest over the repetitions
}

// long streams reps answers of model, one at a time, as fast as the fake
// writes them.
func long(ctx context.Context, c *http.Client, s side, model string, reps int) (longFigures, int, error) {
	var f longFigures
	var rates []float64
	tokens := 0
	for i := range reps {
		r, err := stream(ctx, c, s, model, fmt.Sprint("long ", i), false)
		if err != nil {
			return f, tokens, err
		}
		tokens += r.tokens
		f.Tokens = r.tokens
		rates = append(rates, float64(r.tokens)/r.total.Seconds())
		f.MaxGap = max(f.MaxGap, r.maxGap)
	}
	slices.Sort(rates)
	f.TokensPerSec = rates[len(rates)/2]
	return f, tokens, nil
}

// prefillFigures is workload 4 on one side.
type prefillFigures struct {
	TTFB time.Duration `json:"ttfb_ns"`
	Done bool          `json:"done"`
}

// goneFigures is workload 7 on one side: client cancel → the fake sees its
// request's client go away.
type goneFigures struct {
	Tries int           `json:"tries"`
	P50   time.Duration `json:"p50_ns"`
	Max   time.Duration `json:"max_ns"`
}

// clientGone streams tries answers of a model that never ends, cancels each
// after three tokens, and measures how long until the fake records that
// its client went away.
func clientGone(ctx context.Context, c *http.Client, fake *fakeollama.Server, s side, tries int) (goneFigures, error) {
	f := goneFigures{Tries: tries}
	var lat []time.Duration
	for i := range tries {
		d, err := goneOnce(ctx, c, fake, s, fmt.Sprintf("gone %s %d", s.name, i))
		if err != nil {
			return f, err
		}
		lat = append(lat, d)
	}
	f.P50, f.Max = percentile(lat, 50), slices.Max(lat)
	return f, nil
}

func goneOnce(ctx context.Context, c *http.Client, fake *fakeollama.Server, s side, prompt string) (time.Duration, error) {
	fake.Reset()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := open(rctx, c, s, modelGone, prompt)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := read(resp, s, time.Now(), 3, false); err != nil {
		return 0, err
	}
	var id int64
	for _, r := range fake.Requests() {
		if r.Path == "/api/chat" && bytes.Contains(r.Body, []byte(prompt)) {
			id = r.ID
		}
	}
	if id == 0 {
		return 0, fmt.Errorf("%s: the fake has no request for %q", s.name, prompt)
	}
	cancelled := time.Now()
	cancel()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	gone, err := fake.WaitForDisconnect(wctx, id)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", s.name, err)
	}
	return gone.Sub(cancelled), nil
}

// percentile returns the p-th percentile (nearest rank) of ds; it sorts ds.
func percentile(ds []time.Duration, p int) time.Duration {
	slices.Sort(ds)
	i := (len(ds)*p + 99) / 100 // ceil(n·p/100), 1-based
	return ds[max(i-1, 0)]
}
