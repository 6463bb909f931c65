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
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/internal/node/agent"
	"github.com/iop-dev/iop/internal/node/nodeconfig"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The source's own verification (R8): a prefill longer than the heartbeat
// response wait, then an answer streamed through the raw provider tunnel.
// The Node stays connected and ready on the same generation, the answer
// ends with its normal terminal, and no heartbeat_timeout occurs. Both
// sides run the liveness profile scaled down 30× (1 s / 1.5 s) so the
// 3 s prefill is twice the response wait.
func TestLongPrefillThroughTheTunnelKeepsTheNode(t *testing.T) {
	live := quicwire.DefaultLiveness.Scaled(30)
	fake := fakeollama.New(fakeollama.Model{Name: "prefill:latest", PrefillDelay: 3 * time.Second, TokenCount: 20, TokenDelay: 10 * time.Millisecond})
	defer fake.Close()
	edge := startInProcessEdgeWith(t, live)
	cfg := nodeconfig.Default()
	cfg.NodeID = "n1"
	cfg.Edge.Address = edge.addr
	cfg.Identity.Mode = yamlconf.ModeLoopback
	cfg.Providers = []nodeconfig.Provider{{Name: "ollama", Adapter: "ollama", Capacity: 2, Config: map[string]any{"base_url": fake.URL()}}}
	a, err := agent.New(cfg, agent.Options{Logger: slog.New(slog.DiscardHandler), Liveness: live, Self: []string{bin.noded, "plugin"}})
	if err != nil {
		t.Fatal(err)
	}
	a.Start(t.Context())
	defer a.Stop(context.Background())
	conn := edge.waitProvider(t, "n1", "ollama")

	body := `{"model":"prefill","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	start := time.Now()
	ts, err := edge.srv.Tunnel(t.Context(), "n1", &wirepb.TunnelRequest{
		TunnelId: "t1", Provider: "ollama", Target: "prefill:latest", Method: "POST", Path: "/api/chat",
		Headers: []*wirepb.Header{{Name: "Content-Type", Value: "application/json"}},
	}, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	head, err := ts.Head()
	if err != nil || head.GetStatus() != http.StatusOK {
		t.Fatalf("head: %v %v", head, err)
	}
	sc := bufio.NewScanner(ts)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("body: %v (terminal %v)", err, ts.Terminal())
	}
	if waited := time.Since(start); waited < 3*time.Second {
		t.Errorf("answer after %v, want the full 3 s prefill", waited)
	}
	if len(lines) != 21 || !strings.Contains(lines[len(lines)-1], `"done":true`) {
		t.Errorf("got %d lines, last %q; want 20 tokens and the done line", len(lines), lines[len(lines)-1])
	}
	if ts.Terminal().GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED {
		t.Errorf("terminal %v", ts.Terminal())
	}
	if c, err := edge.reg.Dispatchable("n1"); err != nil || c != conn {
		t.Errorf("after the prefill the node is %v (%v), want the same ready generation", c, err)
	}
	if _, _, fenced := conn.FenceReason(); fenced {
		t.Error("the generation was fenced during the prefill")
	}
}

// A client that goes away mid-stream cancels its run, and the provider's
// request is closed (through Edge, Node and plugin).
func TestClientDisconnectReachesTheProvider(t *testing.T) {
	s := startStack(t, fakeModels()...)
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, "POST", s.base+"/v1/chat/completions", strings.NewReader(
		`{"model":"`+slowModel+`","stream":true,"messages":[{"role":"user","content":"(run gone)"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	for range 3 {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	var reqs []fakeollama.Request
	for _, r := range s.fake.Requests() {
		if r.Path == "/api/chat" {
			reqs = append(reqs, r)
		}
	}
	if len(reqs) != 1 {
		t.Fatalf("provider saw %d chat requests", len(reqs))
	}
	gone := time.Now()
	cancel()
	resp.Body.Close()
	wctx, wcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer wcancel()
	at, err := s.fake.WaitForDisconnect(wctx, reqs[0].ID)
	if err != nil {
		t.Fatalf("the provider's request was never closed: %v", err)
	}
	t.Logf("client gone → provider request closed in %v", at.Sub(gone))
}

// After output has started, a provider failure reaches the client as an
// error in the API's own stream form, never as a silent end.
func TestFailureAfterOutputIsAnErrorEventNotASilentEnd(t *testing.T) {
	s := startStack(t, fakeollama.Model{Name: "flaky:latest", TokenCount: 10, ErrorMessage: "GPU fell off the bus", ErrorAfter: 3})
	c := s.openai()
	stream := c.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model: "flaky", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	n := 0
	for stream.Next() {
		n++
	}
	if err := stream.Err(); err == nil || !strings.Contains(err.Error(), "GPU fell off the bus") {
		t.Fatalf("stream ended with %v after %d chunks; want the provider's error", err, n)
	}
	if n < 3 {
		t.Errorf("only %d chunks before the error: output should have started", n)
	}
}

// Queue admission through the API: with one slot, waiting requests run in
// arrival order; a full queue and a queue timeout are refused with their
// reasons; a Node that joins mid-queue drains it.
func TestQueueOrderRefusalsAndANodeJoiningMidQueue(t *testing.T) {
	// One fake Ollama per Node, so each Node's share can be told apart.
	model := fakeollama.Model{Name: "q:latest", TokenCount: 5, TokenDelay: 300 * time.Millisecond}
	fakes := map[string]*fakeollama.Server{"n1": fakeollama.New(model), "n2": fakeollama.New(model)}
	for _, f := range fakes {
		defer f.Close()
	}
	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	edgeConf := filepath.Join(dir, "edge.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api: {allow_anonymous: true}
profiles:
  - {name: default, queue_timeout: 20s, max_queue_depth: 3, idle_timeout: 60s}
  - {name: impatient, queue_timeout: 500ms, max_queue_depth: 3, idle_timeout: 60s}
routes:
  - {name: q, model: q, profile: default}
  - {name: q2, model: q-now, profile: impatient, targets: [{target: "q:latest"}]}
`, quicPort, httpPort))
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	start(t, "edged", bin.edged, "run", "--config", edgeConf)
	nodeConf := func(id string) string {
		p := filepath.Join(dir, id+".yaml")
		writeFile(t, p, fmt.Sprintf(`
node_id: %s
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
providers: [{name: ollama, adapter: ollama, capacity: 1, config: {base_url: %q}}]
`, id, quicPort, fakes[id].URL()))
		return p
	}
	start(t, "noded n1", bin.noded, "run", "--config", nodeConf("n1"))
	waitNode(t, base, "n1", "ready", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
	})

	post := func(model, tag string) (int, http.Header, string) {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(
			`{"model":"`+model+`","messages":[{"role":"user","content":"(run `+tag+`)"}]}`))
		if err != nil {
			return 0, nil, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	type result struct {
		tag    string
		status int
	}
	results := make(chan result, 8)
	var wg sync.WaitGroup
	// One runs, three wait (the queue's depth): arrival order 0..3.
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, _ := post("q", fmt.Sprint(i))
			results <- result{fmt.Sprint(i), code}
		}()
		waitFor(t, "request queued", func() bool { return queuedOrRunning(t, base) >= i+1 })
	}
	// The queue is full: refused at once, with its reason.
	code, hdr, body := post("q", "full")
	if code != http.StatusTooManyRequests || hdr.Get("X-Iop-Refusal") != "queue_full" || hdr.Get("Retry-After") == "" {
		t.Errorf("full queue: %d %v %s", code, hdr, body)
	}
	// A second Node joins mid-queue: the queue drains faster, in order.
	start(t, "noded n2", bin.noded, "run", "--config", nodeConf("n2"))
	wg.Wait()
	close(results)
	for r := range results {
		if r.status != http.StatusOK {
			t.Errorf("request %s: %d", r.tag, r.status)
		}
	}
	// Provider request start order, across both Nodes, is the grant order.
	reqs := append(fakes["n1"].Requests(), fakes["n2"].Requests()...)
	slices.SortFunc(reqs, func(a, b fakeollama.Request) int { return a.Start.Compare(b.Start) })
	var grants []string
	for _, r := range reqs {
		if r.Path != "/api/chat" {
			continue
		}
		var b struct{ Messages []struct{ Content string } }
		json.NewDecoder(bytes.NewReader(r.Body)).Decode(&b)
		if len(b.Messages) > 0 {
			grants = append(grants, strings.TrimSuffix(strings.TrimPrefix(b.Messages[0].Content, "(run "), ")"))
		}
	}
	if strings.Join(grants, ",") != "0,1,2,3" {
		t.Errorf("provider saw the requests in order %v, want arrival order 0,1,2,3", grants)
	}
	if len(workOf(fakes["n2"])) == 0 {
		t.Errorf("the node that joined mid-queue served nothing")
	}
	// A queue timeout: both slots held, the impatient route waits 500 ms.
	var hold sync.WaitGroup
	for i := range 2 {
		hold.Add(1)
		go func() { defer hold.Done(); post("q", fmt.Sprint("hold", i)) }()
	}
	waitFor(t, "both slots busy", func() bool { return queuedOrRunning(t, base) >= 2 })
	code, hdr, body = post("q-now", "late")
	if code != http.StatusTooManyRequests || hdr.Get("X-Iop-Refusal") != "queue_timeout" {
		t.Errorf("queue timeout: %d %v %s", code, hdr, body)
	}
	hold.Wait()
}

// queuedOrRunning counts requests waiting or holding a slot, from the
// admin API.
func queuedOrRunning(t *testing.T, base string) int {
	resp, err := http.Get(base + "/admin/v1/queues")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var body struct {
		Queues []struct {
			Depth    int `json:"depth"`
			InFlight int `json:"in_flight"`
		} `json:"queues"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	n := 0
	for _, q := range body.Queues {
		n += q.Depth + q.InFlight
	}
	return n
}
