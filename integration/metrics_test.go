package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// The metrics people graph (issue 15, P5), scraped from real daemons after
// known work: the Edge counts requests by route, model, principal and
// outcome, tokens by model, principal and Node, time to first token and
// pace by model; the Node counts its calls by kind, provider and outcome,
// failures by kind, and shows its providers. Then every query of the
// Grafana dashboard in configs/grafana must name a metric those scrapes
// have, with the labels it has.

const metricsKey = "sk-metrics-test-key"

// keyTransport sends the test's API key with every request.
type keyTransport struct{}

func (keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+metricsKey)
	return http.DefaultTransport.RoundTrip(r)
}

func TestMetricsAfterKnownWork(t *testing.T) {
	// A steady answer of 8 words, 17 prompt tokens; one that fails after
	// its first line.
	fake := fakeollama.New(
		fakeollama.Model{Name: "llama3.2:latest", Text: "The sky is blue because of Rayleigh scattering.", PromptEvalCount: 17, TokenDelay: 5 * time.Millisecond},
		fakeollama.Model{Name: "broken:latest", TokenCount: 4, ErrorMessage: "out of memory", ErrorAfter: 1},
		fakeollama.Model{Name: "slow:latest", TokenCount: 20, TokenDelay: 50 * time.Millisecond},
	)
	t.Cleanup(fake.Close)
	dir := t.TempDir()
	quicPort, httpPort, healthPort := freePort(t, "udp"), freePort(t, "tcp"), freePort(t, "tcp")
	sum := sha256.Sum256([]byte(metricsKey))
	edgeConf, nodeConf := filepath.Join(dir, "edge.yaml"), filepath.Join(dir, "node.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api:
  keys: [{principal: alice, sha256: %s}]
  admin_reads: open
principals: [{name: alice, routes: ["*"]}]
profiles:
  - {name: default, deadline: 1m, queue_timeout: 5s, idle_timeout: 30s}
`, quicPort, httpPort, hex.EncodeToString(sum[:])))
	writeFile(t, nodeConf, fmt.Sprintf(`
node_id: n1
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
providers: [{name: ollama, adapter: ollama, capacity: 4, config: {base_url: %q}}]
`, quicPort, fake.URL()))
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	nodeMetrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", healthPort)
	// A tenth of the liveness profile: the Edge's first heartbeat, whose
	// round trip it exports, goes out after 3 s instead of 30.
	start(t, "edged", bin.edged, "run", "--config", edgeConf, "--test-liveness-divisor=10")
	start(t, "noded", bin.noded, "run", "--config", nodeConf, "--health-addr", fmt.Sprintf("127.0.0.1:%d", healthPort))
	waitNode(t, base, "n1", "ready with ollama online", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
	})

	// While a run streams, the Edge shows it in flight, its model's queue,
	// and the Node the slot it holds.
	oai := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey(metricsKey), option.WithMaxRetries(0))
	slow := oai.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model: "slow", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("take your time")},
	})
	if !slow.Next() {
		t.Fatalf("the slow stream ended at once: %v", slow.Err())
	}
	midEdge := waitSeries(t, base+"/metrics", `iop_edge_active{kind="run"} 1`, `iop_edge_queue_depth{model="slow"} 0`)
	midNode := waitSeries(t, nodeMetrics, `iop_node_provider_slots_in_use{provider="ollama"} 1`)
	for slow.Next() {
	}
	if err := slow.Err(); err != nil {
		t.Fatalf("the slow stream: %v", err)
	}

	// The known work: an OpenAI streamed chat (a normalized run) and an
	// Ollama chat (a raw tunnel) of llama3.2; a run that fails at the
	// provider; a model nobody serves; a request without a key.
	stream := oai.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model: "llama3.2", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("why is the sky blue?")},
	})
	var text strings.Builder
	for stream.Next() {
		if c := stream.Current(); len(c.Choices) > 0 {
			text.WriteString(c.Choices[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil || text.String() != "The sky is blue because of Rayleigh scattering." {
		t.Fatalf("OpenAI streamed chat: %q, %v", text.String(), err)
	}
	u, _ := url.Parse(base)
	oll := api.NewClient(u, &http.Client{Transport: keyTransport{}})
	var final api.ChatResponse
	err := oll.Chat(t.Context(), &api.ChatRequest{Model: "llama3.2", Messages: []api.Message{{Role: "user", Content: "why?"}}},
		func(r api.ChatResponse) error { final = r; return nil })
	if err != nil || !final.Done || final.PromptEvalCount != 17 || final.EvalCount != 8 {
		t.Fatalf("Ollama chat: %v, final line %+v", err, final)
	}
	if _, err := oai.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: "broken", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	}); err == nil {
		t.Fatal("a chat whose provider failed succeeded")
	}
	if _, err := oai.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: "no-such-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	}); err == nil {
		t.Fatal("a chat for a model nobody serves succeeded")
	}
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"llama3.2","messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a request without a key: %d, want 401", resp.StatusCode)
	}

	// The Edge records a request when its handler ends, the Node a call
	// when its terminal is sent: both may come a moment after the client
	// has its answer, so the scrapes are polled.
	edgeOut := waitSeries(t, base+"/metrics",
		`iop_edge_requests_total{model="llama3.2",outcome="ok",principal="alice",route="openai_chat"} 1`,
		`iop_edge_requests_total{model="llama3.2",outcome="ok",principal="alice",route="ollama_chat"} 1`,
		`iop_edge_requests_total{model="broken",outcome="upstream",principal="alice",route="openai_chat"} 1`,
		// A model nobody serves labels nothing: no series for a made-up name.
		`iop_edge_requests_total{model="",outcome="model_not_found",principal="alice",route="openai_chat"} 1`,
		`iop_edge_requests_total{model="",outcome="unauthenticated",principal="",route="openai_chat"} 1`,
		// 17 prompt and 8 completion tokens each: the run's from its
		// terminal's usage, the tunnel's from the final NDJSON line.
		`iop_edge_prompt_tokens_total{model="llama3.2",node="n1",principal="alice"} 34`,
		`iop_edge_completion_tokens_total{model="llama3.2",node="n1",principal="alice"} 16`,
		`iop_edge_time_to_first_token_seconds_count{model="llama3.2",route="openai_chat"} 1`,
		`iop_edge_time_to_first_token_seconds_count{model="llama3.2",route="ollama_chat"} 1`,
		`iop_edge_tokens_per_second_count{model="llama3.2"} 2`,
	)
	if strings.Contains(edgeOut, "no-such-model") {
		t.Errorf("a model nobody serves made a series:\n%s", grepLines(edgeOut, "no-such-model"))
	}
	nodeOut := waitSeries(t, nodeMetrics,
		`iop_node_calls_total{kind="run",outcome="completed",provider="ollama"} 2`,
		`iop_node_calls_total{kind="tunnel",outcome="completed",provider="ollama"} 1`,
		`iop_node_calls_total{kind="run",outcome="failed",provider="ollama"} 1`,
		`iop_node_call_failures_total{failure="upstream",kind="run",provider="ollama"} 1`,
		`iop_node_provider_online{provider="ollama"} 1`,
		`iop_node_provider_capacity{provider="ollama"} 4`,
		`iop_node_provider_slots_in_use{provider="ollama"} 0`,
		`iop_node_plugin_circuit{provider="ollama",state="closed"} 1`,
		`iop_node_plugin_restarts_total{provider="ollama"} 0`,
		`iop_node_stalls_total{classification="request_stalled",provider="ollama"} 0`,
		`iop_node_lease_refusals_total{reason="expired"} 0`,
		`iop_node_edge_state{state="ready"} 1`,
	)
	// Both daemons collect garbage at GOGC=50 unless the environment
	// says otherwise (internal/gctarget, issue 25).
	if _, set := os.LookupEnv("GOGC"); !set {
		for name, out := range map[string]string{"edged": edgeOut, "noded": nodeOut} {
			if !slices.Contains(strings.Split(out, "\n"), "go_gc_gogc_percent 50") {
				t.Errorf("%s does not collect at GOGC=50:\n%s", name, grepLines(out, "go_gc_gogc_percent"))
			}
		}
	}
	// The Edge's first heartbeat (3 s in, scaled) makes its round trip.
	waitFor(t, "the Edge's first heartbeat round trip", func() bool {
		edgeOut = scrapeText(t, base+"/metrics")
		return strings.Contains(edgeOut, `iop_edge_heartbeat_rtt_seconds{node="n1"}`)
	})

	t.Run("every query of the Grafana dashboard names an exported metric", func(t *testing.T) {
		checkDashboard(t, "../configs/grafana/iop.json", parseExposition(midEdge+midNode+edgeOut+nodeOut))
	})
}

// scrapeText is a /metrics text.
func scrapeText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

// waitSeries scrapes url until it has every one of series (whole lines:
// name, labels, value), for up to 10 s, and returns the last scrape.
func waitSeries(t *testing.T, url string, series ...string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := scrapeText(t, url)
		lines := strings.Split(out, "\n")
		var missing []string
		for _, s := range series {
			if !slices.Contains(lines, s) {
				missing = append(missing, s)
			}
		}
		if len(missing) == 0 {
			return out
		}
		if time.Now().After(deadline) {
			for _, s := range missing {
				t.Errorf("%s lacks %s; it has:\n%s", url, s, grepLines(out, strings.SplitN(s, "{", 2)[0]))
			}
			return out
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metricValue is the value of series (name and labels, as the exposition
// writes them) in a /metrics text, 0 when it is not there.
func metricValue(out, series string) float64 {
	for l := range strings.SplitSeq(out, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// labelPair is one label of a series in the exposition format.
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"`)

// parseExposition returns every sample name of a /metrics text (a
// histogram's _bucket, _sum and _count apart) with the label names its
// series have.
func parseExposition(out string) map[string]map[string]bool {
	names := map[string]map[string]bool{}
	for l := range strings.SplitSeq(out, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		name, rest, _ := strings.Cut(l, "{")
		if !strings.Contains(l, "{") {
			name, _, _ = strings.Cut(l, " ")
			rest = ""
		}
		if names[name] == nil {
			names[name] = map[string]bool{}
		}
		for _, m := range labelPair.FindAllStringSubmatch(rest, -1) {
			names[name][m[1]] = true
		}
	}
	return names
}

// labelValues is Grafana's variable query label_values(selector, label).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

// checkDashboard parses every query of the dashboard at path (the panels'
// and the variables') and checks each selector against exported: the
// metric is there, and has the labels the selector matches on.
func checkDashboard(t *testing.T, path string, exported map[string]map[string]bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels     []dashPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	type query struct{ where, expr string }
	var queries []query
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				queries = append(queries, query{fmt.Sprintf("panel %q, target %s", p.Title, tg.RefID), tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	check := func(where, expr string, extraLabel string) {
		sels, err := parsePromQL(expr)
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", where, expr, err)
			return
		}
		if len(sels) == 0 {
			t.Errorf("%s: %q names no metric", where, expr)
		}
		for _, s := range sels {
			labels, ok := exported[s.name]
			if !ok {
				t.Errorf("%s: %q names %s, which the daemons do not export", where, expr, s.name)
				continue
			}
			for _, l := range append(s.labels, extraLabel) {
				if l != "" && !labels[l] {
					t.Errorf("%s: %q uses label %q of %s, which has none", where, expr, l, s.name)
				}
			}
		}
	}
	for _, q := range queries {
		check(q.where, q.expr, "")
	}
	panels := len(queries)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			_ = json.Unmarshal(v.Query, &q.Query) // a plain string, as older dashboards write it
		}
		m := labelValues.FindStringSubmatch(strings.TrimSpace(q.Query))
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(metric, label)", v.Name, q.Query)
			continue
		}
		check("variable "+v.Name, m[1], m[2])
	}
	if panels < 20 {
		t.Errorf("the dashboard has %d panel queries; want the issue's metrics and the existing ones (20 at least)", panels)
	}
}

// dashPanel is what the test reads of a Grafana panel: its queries, and a
// row's panels.
type dashPanel struct {
	Title   string `json:"title"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"`
}
