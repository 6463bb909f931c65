// Command affinitybench measures what session affinity saves a coding
// agent's session (issue 21): the time to first token of each turn, summed
// over a session, when its turns stick to the Node that ran the last one
// and when they do not, against the same session sent straight to one
// model server (the floor: every turn finds its prefix cached).
//
//	go run ./integration/cmd/affinitybench                  # 30 turns, about a minute
//	go run ./integration/cmd/affinitybench -turns 10 -out r.json
//
// It builds edged and noded, starts two fake Ollama servers in this
// process (internal/fakes/fakeollama) whose prefill costs
// -prefill-per-token for every prompt token not in that server's prompt
// cache (the prefix it has already seen, as a real server's KV cache), and
// one more for the direct side; then edged and two noded processes, one
// Node per fake, each with one ollama provider of capacity 4 serving the
// model. A session is a system prompt of -system tokens and -turns turns,
// each adding a user message of -per-turn tokens and the model's short
// answer, as an agent's conversation grows; every turn is one streamed
// OpenAI chat completion, its time to first token measured at the client.
//
//   - direct: the session straight to the third fake's /api/chat;
//   - affinity: through the Edge, naming its session (prompt_cache_key);
//   - none: through the Edge, naming none, so the scheduler spreads the
//     turns over the two Nodes by load alone;
//   - hammer (bounded load): -hammer requests of one session at once, each
//     a whole prompt: how many each Node took (affinity must not pin one
//     hot session to one Node while the other idles).
//
// Each phase starts with both fakes' prompt caches empty. The Edge's
// session metric (iop_edge_session_turns_total) is read after each phase.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

const model = "coder"

func main() {
	var o options
	flag.IntVar(&o.turns, "turns", 30, "turns of the session")
	flag.IntVar(&o.system, "system", 4000, "tokens of the system prompt")
	flag.IntVar(&o.perTurn, "per-turn", 300, "tokens each turn's user message adds")
	flag.DurationVar(&o.perToken, "prefill-per-token", 200*time.Microsecond, "the fakes' prefill cost per uncached prompt token")
	flag.IntVar(&o.hammer, "hammer", 16, "concurrent requests of one session in the bounded-load phase")
	out := flag.String("out", "", "also write the results as JSON to this file")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "affinitybench:", err)
		os.Exit(1)
	}
	r.print(os.Stdout)
	if *out != "" {
		b, _ := json.MarshalIndent(r, "", "  ")
		if err := os.WriteFile(*out, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "affinitybench:", err)
			os.Exit(1)
		}
	}
}

type options struct {
	turns, system, perTurn, hammer int
	perToken                       time.Duration
}

// session is one phase's measurement of a session.
type session struct {
	// TTFT is each turn's time to first token, in milliseconds.
	TTFT []float64 `json:"ttft_ms"`
	// SumMS is their sum.
	SumMS float64 `json:"sum_ms"`
	// OnNode counts the turns each Node (fake) served.
	OnNode map[string]int `json:"on_node,omitempty"`
	// Cached is the share of prompt tokens the serving fake had cached,
	// over all turns.
	Cached float64 `json:"cached_share"`
	// Turns are the Edge's session turns by outcome after the phase.
	Turns map[string]float64 `json:"session_turns,omitempty"`
}

type results struct {
	Options struct {
		Turns, SystemTokens, PerTurnTokens, Hammer int
		PrefillPerToken                            string
	} `json:"options"`
	Direct   session `json:"direct"`
	Affinity session `json:"affinity"`
	None     session `json:"none"`
	Hammer   session `json:"hammer"`
}

func run(ctx context.Context, o options) (*results, error) {
	dir, err := os.MkdirTemp("", "affinitybench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(os.Stderr, "building edged and noded…")
	edged, noded := filepath.Join(dir, "edged"), filepath.Join(dir, "noded")
	for bin, pkg := range map[string]string{edged: "github.com/iop-dev/iop/edged", noded: "github.com/iop-dev/iop/noded"} {
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
		}
	}
	m := fakeollama.Model{Name: model + ":latest", Text: "Done. Next step?", PrefillPerToken: o.perToken}
	fakes := map[string]*fakeollama.Server{}
	for _, n := range []string{"node-a", "node-b", "direct"} {
		f, err := fakeollama.Listen("127.0.0.1:0", m)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		fakes[n] = f
	}
	base, stopStack, err := startStack(ctx, dir, edged, noded, fakes)
	if err != nil {
		return nil, err
	}
	defer stopStack()

	r := &results{}
	r.Options.Turns, r.Options.SystemTokens, r.Options.PerTurnTokens, r.Options.Hammer = o.turns, o.system, o.perTurn, o.hammer
	r.Options.PrefillPerToken = o.perToken.String()
	reset := func() {
		for _, f := range fakes {
			f.ResetPromptCache()
			f.Reset()
		}
	}
	nodes := []string{"node-a", "node-b"}

	fmt.Fprintln(os.Stderr, "direct…")
	reset()
	if r.Direct, err = runSession(ctx, o, func(msgs []message) (time.Duration, error) {
		return ollamaTTFT(ctx, fakes["direct"].URL(), msgs)
	}); err != nil {
		return nil, fmt.Errorf("direct: %w", err)
	}
	r.Direct.Cached = cachedShare(fakes["direct"])
	for _, phase := range []struct {
		name, key string
		s         *session
	}{{"affinity", "session-affinity", &r.Affinity}, {"none", "", &r.None}} {
		fmt.Fprintln(os.Stderr, phase.name+"…")
		reset()
		before, err := sessionTurns(ctx, base)
		if err != nil {
			return nil, err
		}
		if *phase.s, err = runSession(ctx, o, func(msgs []message) (time.Duration, error) {
			return chatTTFT(ctx, base, phase.key, msgs)
		}); err != nil {
			return nil, fmt.Errorf("%s: %w", phase.name, err)
		}
		phase.s.OnNode, phase.s.Cached = served(fakes, nodes)
		after, err := sessionTurns(ctx, base)
		if err != nil {
			return nil, err
		}
		phase.s.Turns = diff(after, before)
	}

	fmt.Fprintln(os.Stderr, "hammer…")
	reset()
	before, err := sessionTurns(ctx, base)
	if err != nil {
		return nil, err
	}
	msgs := conversation(o, 1)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var firstErr error
	for range o.hammer {
		wg.Go(func() {
			d, err := chatTTFT(ctx, base, "session-hot", msgs)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			r.Hammer.TTFT = append(r.Hammer.TTFT, ms(d))
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, fmt.Errorf("hammer: %w", firstErr)
	}
	slices.Sort(r.Hammer.TTFT)
	for _, t := range r.Hammer.TTFT {
		r.Hammer.SumMS += t
	}
	r.Hammer.OnNode, r.Hammer.Cached = served(fakes, nodes)
	after, err := sessionTurns(ctx, base)
	if err != nil {
		return nil, err
	}
	r.Hammer.Turns = diff(after, before)
	return r, nil
}

// message is one chat message of the session.
type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// words is n distinct words, tagged so that no two turns share text.
func words(tag string, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s%d", tag, i)
	}
	return b.String()
}

// conversation is the session's messages at turn k (1-based): the system
// prompt, and k user turns with the model's answers to the first k-1.
func conversation(o options, k int) []message {
	msgs := []message{{Role: "system", Content: words("sys", o.system)}}
	for i := 1; i <= k; i++ {
		if i > 1 {
			msgs = append(msgs, message{Role: "assistant", Content: "Done. Next step?"})
		}
		msgs = append(msgs, message{Role: "user", Content: words(fmt.Sprintf("t%du", i), o.perTurn)})
	}
	return msgs
}

// runSession sends the session's turns one after another with send.
func runSession(ctx context.Context, o options, send func([]message) (time.Duration, error)) (session, error) {
	var s session
	for k := 1; k <= o.turns; k++ {
		d, err := send(conversation(o, k))
		if err != nil {
			return s, fmt.Errorf("turn %d: %w", k, err)
		}
		s.TTFT = append(s.TTFT, ms(d))
		s.SumMS += ms(d)
		if ctx.Err() != nil {
			return s, ctx.Err()
		}
	}
	return s, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

var client = &http.Client{Timeout: 5 * time.Minute}

// chatTTFT streams one chat completion through the Edge and returns the
// time to its first content delta. key, if not "", names the session.
func chatTTFT(ctx context.Context, base, key string, msgs []message) (time.Duration, error) {
	body := map[string]any{"model": model, "messages": msgs, "stream": true}
	if key != "" {
		body["prompt_cache_key"] = key
	}
	return firstToken(ctx, base+"/v1/chat/completions", body, func(line []byte) bool {
		return bytes.HasPrefix(line, []byte("data: {")) && bytes.Contains(line, []byte(`"content":"`)) &&
			!bytes.Contains(line, []byte(`"content":""`))
	})
}

// ollamaTTFT streams one /api/chat straight to a fake and returns the time
// to its first content.
func ollamaTTFT(ctx context.Context, url string, msgs []message) (time.Duration, error) {
	return firstToken(ctx, url+"/api/chat", map[string]any{"model": model, "messages": msgs}, func(line []byte) bool {
		return bytes.Contains(line, []byte(`"content":"`)) && !bytes.Contains(line, []byte(`"content":""`))
	})
}

// firstToken posts body to url and reads the answer to its end; it
// returns the time from sending to the first line first says is a token.
func firstToken(ctx context.Context, url string, body any, first func([]byte) bool) (time.Duration, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1000))
		return 0, fmt.Errorf("%s answered %d: %s", url, resp.StatusCode, msg)
	}
	var ttft time.Duration
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if ttft == 0 && first(sc.Bytes()) {
			ttft = time.Since(start)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if ttft == 0 {
		return 0, fmt.Errorf("%s: no token in the answer", url)
	}
	return ttft, nil
}

// served counts the chat requests each Node's fake served, and the share
// of their prompt tokens its cache held.
func served(fakes map[string]*fakeollama.Server, nodes []string) (map[string]int, float64) {
	on := map[string]int{}
	var prompt, cached int
	for _, n := range nodes {
		for _, r := range fakes[n].Requests() {
			if r.Path == "/api/chat" {
				on[n]++
				prompt += r.PromptTokens
				cached += r.CachedTokens
			}
		}
	}
	if prompt == 0 {
		return on, 0
	}
	return on, float64(cached) / float64(prompt)
}

func cachedShare(f *fakeollama.Server) float64 {
	var prompt, cached int
	for _, r := range f.Requests() {
		prompt += r.PromptTokens
		cached += r.CachedTokens
	}
	if prompt == 0 {
		return 0
	}
	return float64(cached) / float64(prompt)
}

// sessionTurns reads the Edge's iop_edge_session_turns_total by outcome.
func sessionTurns(ctx context.Context, base string) (map[string]float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, `iop_edge_session_turns_total{outcome="`)
		if !ok {
			continue
		}
		outcome, value, _ := strings.Cut(rest, `"} `)
		var v float64
		fmt.Sscan(value, &v)
		out[outcome] = v
	}
	return out, sc.Err()
}

func diff(after, before map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// startStack starts edged and one noded per Node fake, and waits until
// both Nodes are ready. It returns the Edge's HTTP base URL.
func startStack(ctx context.Context, dir, edged, noded string, fakes map[string]*fakeollama.Server) (string, func(), error) {
	quicPort, httpPort, err := freePorts()
	if err != nil {
		return "", nil, err
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	conf := map[string]string{"edge.yaml": fmt.Sprintf(`edge_id: affinity-bench
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api: {allow_anonymous: true}
profiles: [{name: default, queue_timeout: 5m, max_queue_depth: 256}]
`, quicPort, httpPort)}
	for _, n := range []string{"node-a", "node-b"} {
		conf[n+".yaml"] = fmt.Sprintf(`node_id: %s
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
drain_timeout: 2s
providers:
  - {name: ollama, adapter: ollama, capacity: 4, targets: [%q], config: {base_url: %q}}
`, n, quicPort, model+":latest", fakes[n].URL())
	}
	for name, body := range conf {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			return "", nil, err
		}
	}
	var procs []*exec.Cmd
	stop := func() {
		for _, p := range slices.Backward(procs) {
			_ = p.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = p.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				_ = p.Process.Kill()
				<-done
			}
		}
	}
	start := func(name, bin, config string) error {
		log, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			return err
		}
		cmd := exec.Command(bin, "run", "--config", filepath.Join(dir, config))
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		procs = append(procs, cmd)
		return nil
	}
	if err := start("edged", edged, "edge.yaml"); err != nil {
		stop()
		return "", nil, err
	}
	for _, n := range []string{"node-a", "node-b"} {
		if err := start(n, noded, n+".yaml"); err != nil {
			stop()
			return "", nil, err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		if n, _ := readyNodes(wctx, base); n == 2 {
			return base, stop, nil
		}
		select {
		case <-wctx.Done():
			stop()
			logs, _ := os.ReadFile(filepath.Join(dir, "edged.log"))
			return "", nil, fmt.Errorf("waiting for two ready Nodes: %w\n%s", wctx.Err(), logs)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readyNodes counts the Nodes the Edge has ready with the model online.
func readyNodes(ctx context.Context, base string) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/admin/v1/nodes", nil)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var v struct {
		Nodes []struct {
			State     string `json:"state"`
			Providers []struct {
				State   string   `json:"state"`
				Targets []string `json:"targets"`
			} `json:"providers"`
		} `json:"nodes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return 0, err
	}
	n := 0
	for _, node := range v.Nodes {
		if node.State == "ready" && len(node.Providers) > 0 && node.Providers[0].State == "online" {
			n++
		}
	}
	return n, nil
}

func freePorts() (quic, http int, err error) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, err
	}
	defer pc.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, err
	}
	defer ln.Close()
	return pc.LocalAddr().(*net.UDPAddr).Port, ln.Addr().(*net.TCPAddr).Port, nil
}

func (r *results) print(w io.Writer) {
	fmt.Fprintf(w, "session: %d turns, a %d-token system prompt, %d tokens a turn; prefill %v per uncached token; 2 Nodes of capacity 4\n\n",
		r.Options.Turns, r.Options.SystemTokens, r.Options.PerTurnTokens, r.Options.PrefillPerToken)
	fmt.Fprintf(w, "%-28s %14s %14s %14s %10s  %s\n", "", "TTFT sum", "first turn", "median turn", "cached", "turns per Node · session metric")
	for _, p := range []struct {
		name string
		s    session
	}{{"direct (one server)", r.Direct}, {"IOP, session affinity", r.Affinity}, {"IOP, no session named", r.None}} {
		fmt.Fprintf(w, "%-28s %11.0f ms %11.0f ms %11.0f ms %9.0f%%  %v %v\n", p.name, p.s.SumMS, at(p.s.TTFT, 0), median(p.s.TTFT), 100*p.s.Cached, p.s.OnNode, p.s.Turns)
	}
	fmt.Fprintf(w, "\nbounded load: %d requests of one session at once: per Node %v; TTFT median %.0f ms, max %.0f ms; session metric %v\n",
		r.Options.Hammer, r.Hammer.OnNode, median(r.Hammer.TTFT), at(r.Hammer.TTFT, len(r.Hammer.TTFT)-1), r.Hammer.Turns)
}

func at(v []float64, i int) float64 {
	if i < 0 || i >= len(v) {
		return 0
	}
	return v[i]
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
