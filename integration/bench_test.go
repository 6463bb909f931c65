package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/internal/node/agent"
	"github.com/iop-dev/iop/internal/node/nodeconfig"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// BenchmarkNormalizedPath measures one normalized run of 200 tokens through
// Edge → QUIC → Node → plugin process → fake Ollama ("iop"), beside the
// same request sent straight to the fake Ollama ("direct"), in the same run.
// Reported per run: ns/op, time to first token, tokens per second.
//
//	go test -run '^$' -bench NormalizedPath -benchtime 300x ./integration/
func BenchmarkNormalizedPath(b *testing.B) {
	const tokens = 200
	fake := fakeollama.New(fakeollama.Model{Name: "bench:latest", TokenCount: tokens, Seed: 7})
	defer fake.Close()

	b.Run("direct", func(b *testing.B) {
		body, _ := json.Marshal(map[string]any{"model": "bench", "stream": true,
			"messages": []map[string]string{{"role": "user", "content": "hello"}}})
		measure(b, tokens, func() (time.Duration, error) {
			start := time.Now()
			resp, err := http.Post(fake.URL()+"/api/chat", "application/json", bytes.NewReader(body))
			if err != nil {
				return 0, err
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			var ttft time.Duration
			for sc.Scan() {
				if ttft == 0 {
					ttft = time.Since(start)
				}
				var line struct{ Done bool }
				if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
					return 0, err
				}
				if line.Done {
					io.Copy(io.Discard, resp.Body)
					return ttft, nil
				}
			}
			return 0, fmt.Errorf("stream ended without done: %v", sc.Err())
		})
	})

	b.Run("iop", func(b *testing.B) {
		edge := startBenchEdge(b)
		cfg := nodeconfig.Default()
		cfg.NodeID = "bench-node"
		cfg.Edge.Address = edge.addr
		cfg.Identity.Mode = yamlconf.ModeLoopback
		cfg.Providers = []nodeconfig.Provider{{Name: "ollama", Adapter: "ollama", Capacity: 64, Config: map[string]any{"base_url": fake.URL()}}}
		a, err := agent.New(cfg, agent.Options{Logger: slog.New(slog.DiscardHandler), Self: []string{bin.noded, "plugin"}})
		if err != nil {
			b.Fatal(err)
		}
		a.Start(context.Background())
		defer a.Stop(context.Background())
		deadline := time.Now().Add(30 * time.Second)
		for !edge.providerOnline("bench-node", "ollama") {
			if time.Now().After(deadline) {
				b.Fatal("bench node never ready")
			}
			time.Sleep(10 * time.Millisecond)
		}
		n := 0
		measure(b, tokens, func() (time.Duration, error) {
			n++
			start := time.Now()
			rs, err := edge.srv.Run(context.Background(), "bench-node", &wirepb.RunRequest{RunId: fmt.Sprint("b", n), Provider: "ollama", Target: "bench",
				Messages: []*wirepb.ChatMessage{{Role: "user", Content: "hello"}}})
			if err != nil {
				return 0, err
			}
			var ttft time.Duration
			for {
				ev, err := rs.Next()
				if err != nil {
					return 0, err
				}
				if ttft == 0 {
					ttft = time.Since(start)
				}
				if ev.GetType().IsTerminal() {
					if ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
						return 0, fmt.Errorf("run ended with %v", ev)
					}
					return ttft, nil
				}
			}
		})
	})
}

// measure runs op b.N times and reports TTFT percentiles and tokens/s.
func measure(b *testing.B, tokens int, op func() (time.Duration, error)) {
	b.Helper()
	if _, err := op(); err != nil { // warm up connections and the plugin
		b.Fatal(err)
	}
	ttfts := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		ttft, err := op()
		if err != nil {
			b.Fatal(err)
		}
		ttfts = append(ttfts, ttft)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(ttfts)
	b.ReportMetric(float64(ttfts[len(ttfts)/2].Microseconds()), "ttft-p50-µs")
	b.ReportMetric(float64(ttfts[len(ttfts)*99/100].Microseconds()), "ttft-p99-µs")
	b.ReportMetric(float64(tokens*b.N)/elapsed.Seconds(), "tokens/s")
}
