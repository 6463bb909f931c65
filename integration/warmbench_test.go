package integration

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// TestWarmBench is issue 23's benchmark: two models over two Nodes whose
// model servers hold one model at a time and take warmBenchLoad to load
// another (fake Ollamas with a Loading, evicting as Ollama does), mixed
// traffic (warmBenchClients clients, each warmBenchRequests streamed
// /api/chat requests, each for one of the two models at random), through a
// real edged and two real noded: once routed warm first (the default) and
// once by free capacity alone (scheduling.warm_first: false), each on a
// fresh fleet with nothing loaded. It measures, never asserts: time to
// first token (request sent → first token) p50 and p99, the loads and
// evictions the two servers made, the wall time, and the Edge's route
// choices. It runs for about two minutes, so it is skipped unless asked
// for:
//
//	IOP_WARM_BENCH=1 go test -run TestWarmBench -v -timeout 10m ./integration/
//
// The table is the log lines prefixed "warm bench:".
func TestWarmBench(t *testing.T) {
	if os.Getenv("IOP_WARM_BENCH") != "1" {
		t.Skip("the warm-first benchmark runs with IOP_WARM_BENCH=1")
	}
	logWarm(t, fmt.Sprintf("two Nodes of capacity %d, each before a fake Ollama holding 1 model and taking %v to load another; "+
		"%d clients × %d streamed /api/chat, each for alpha or beta at random (answers of %d tokens %v apart)",
		warmBenchCapacity, warmBenchLoad, warmBenchClients, warmBenchRequests, warmBenchModels[0].TokenCount, warmBenchModels[0].TokenDelay))
	logWarm(t, "| routing | wall | TTFT p50 | TTFT p99 | loads (evictions) | route choices |")
	logWarm(t, "|---|---|---|---|---|---|")
	for _, warmFirst := range []bool{true, false} {
		r := warmBenchRun(t, warmFirst)
		name := "warm first"
		if !warmFirst {
			name = "free capacity only"
		}
		logWarm(t, fmt.Sprintf("| %s | %.1f s | %s | %s | %d (%d) | %s |", name, r.wall.Seconds(),
			benchMS(r.p50), benchMS(r.p99), r.loads, r.evictions, r.choices))
	}
}

// warmBenchModels answer 20 tokens 10 ms apart: a fifth of a second each,
// so that a 2 s load is what dominates when it happens.
var warmBenchModels = []fakeollama.Model{
	{Name: "alpha:latest", TokenCount: 20, TokenDelay: 10 * time.Millisecond, Seed: 1},
	{Name: "beta:latest", TokenCount: 20, TokenDelay: 10 * time.Millisecond, Seed: 2},
}

const (
	warmBenchClients  = 16
	warmBenchRequests = 6
	warmBenchCapacity = 4
	warmBenchLoad     = 2 * time.Second
)

func logWarm(t *testing.T, line string) {
	t.Helper()
	t.Logf("warm bench: %s", line)
}

// warmResult is one run's figures.
type warmResult struct {
	wall             time.Duration
	p50, p99         time.Duration
	loads, evictions int64
	choices          string
}

// warmBenchRun runs the load on a fresh fleet, warm first or not.
func warmBenchRun(t *testing.T, warmFirst bool) warmResult {
	fakes := make([]*fakeollama.Server, 2)
	for i := range fakes {
		fakes[i] = fakeollama.New(warmBenchModels...)
		fakes[i].SetLoading(fakeollama.Loading{MaxLoaded: 1, LoadTime: warmBenchLoad})
		defer fakes[i].Close()
	}
	f := startWarmFleet(t, warmFirst, warmBenchCapacity, 1, fakes...)
	defer f.edge.stop()
	var (
		mu    sync.Mutex
		ttfts []time.Duration
		wg    sync.WaitGroup
	)
	start := time.Now()
	for c := range warmBenchClients {
		rng := rand.New(rand.NewPCG(uint64(c), 23))
		wg.Go(func() {
			for range warmBenchRequests {
				model := "alpha"
				if rng.IntN(2) == 1 {
					model = "beta"
				}
				d := f.chat(t, model)
				mu.Lock()
				ttfts = append(ttfts, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	r := warmResult{wall: time.Since(start)}
	slices.Sort(ttfts)
	r.p50, r.p99 = ttfts[len(ttfts)/2], ttfts[(len(ttfts)*99)/100]
	for _, fake := range fakes {
		st := fake.Loads()
		r.loads += st.Loads
		r.evictions += st.Evictions
	}
	metrics := scrapeText(t, f.base+"/metrics")
	for _, reason := range []string{"warm", "room", "evict", "spill", "cold", "unknown"} {
		if n := metricValue(metrics, fmt.Sprintf(`iop_edge_route_choices_total{reason=%q}`, reason)); n > 0 {
			if r.choices != "" {
				r.choices += ", "
			}
			r.choices += fmt.Sprintf("%s %.0f", reason, n)
		}
	}
	return r
}
