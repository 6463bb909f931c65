package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// These tests run a real noded process, with its adapters as real plugin
// processes, connected over real QUIC on 127.0.0.1 to an Edge in the test
// process (whose Go API sends the runs), in front of the fake Ollama.

const slowModel = "slow:latest"

func fakeModels() []fakeollama.Model {
	return []fakeollama.Model{
		{Name: "llama3.2:latest", Text: "The sky is blue because of Rayleigh scattering.",
			ToolCalls: []fakeollama.ToolCall{{Name: "get_weather", Arguments: []byte(`{"city":"Paris"}`)}}},
		{Name: slowModel, TokenCount: 100, TokenDelay: 30 * time.Millisecond},
	}
}

// nodeUnderTest is a noded process and what it serves.
type nodeUnderTest struct {
	proc *proc
	fake *fakeollama.Server
	edge *inProcessEdge
	id   string
}

// startNode runs noded with an ollama provider (capacity 2), a
// single-slot one on the same server, and the SDK's scriptable test
// adapter as a third-party plugin pinned by its SHA-256.
func startNode(t *testing.T, id string) *nodeUnderTest {
	t.Helper()
	fake := fakeollama.New(fakeModels()...)
	t.Cleanup(fake.Close)
	edge := startInProcessEdge(t)
	sum, err := fileSHA256(bin.testadapter)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "node.yaml")
	writeFile(t, conf, fmt.Sprintf(`
node_id: %s
edge: {address: %q}
identity: {mode: loopback}
drain_timeout: 5s
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
providers:
  - {name: ollama, adapter: ollama, capacity: 2, config: {base_url: %q}}
  - {name: ollama-one, adapter: ollama, capacity: 1, idle_stop: 0s, targets: [%q], config: {base_url: %q}}
  - {name: scripted, adapter: external, binary: %q, sha256: %s, capacity: 4, targets: [garbage, "text:5"]}
log: {level: debug}
`, id, edge.addr, fake.URL(), slowModel, fake.URL(), bin.testadapter, sum))
	p := start(t, "noded", bin.noded, "run", "--config", conf)
	n := &nodeUnderTest{proc: p, fake: fake, edge: edge, id: id}
	for _, prov := range []string{"ollama", "ollama-one", "scripted"} {
		edge.waitProvider(t, id, prov)
	}
	return n
}

func fileSHA256(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:]), nil
}

// pluginPids are the noded process's plugin children.
func (n *nodeUnderTest) pluginPids() []int { return children(n.proc.cmd.Process.Pid) }

func chat(id, provider, target string) *wirepb.RunRequest {
	return &wirepb.RunRequest{RunId: id, SessionId: "session-1", Provider: provider, Target: target,
		Messages: []*wirepb.ChatMessage{{Role: "user", Content: "Why is the sky blue? (run " + id + ")"}}}
}

// R2, S2: a streamed run with text, a tool call and usage arrives in order
// and ends in exactly one terminal, through Edge, QUIC, Node, plugin and
// the fake Ollama.
func TestRunStreamsTextToolCallsAndUsageInOrder(t *testing.T) {
	n := startNode(t, "n1")
	req := chat("r1", "ollama", "llama3.2")
	req.Tools = []*wirepb.Tool{{Name: "get_weather", Description: "weather", ParametersJson: []byte(`{"type":"object","properties":{"city":{"type":"string"}}}`)}}
	rs, err := n.edge.srv.Run(t.Context(), n.id, req)
	if err != nil {
		t.Fatal(err)
	}
	evs := collect(t, rs)
	term := evs[len(evs)-1]
	if term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
		t.Fatalf("terminal %v", term)
	}
	if got, want := textOf(evs), "The sky is blue because of Rayleigh scattering."; got != want {
		t.Errorf("text %q, want %q", got, want)
	}
	var calls, usage int
	for i, ev := range evs {
		if ev.GetSeq() != uint64(i+1) || ev.GetRunId() != "r1" || ev.GetSessionId() != "session-1" {
			t.Errorf("event %d: seq %d run %q session %q", i, ev.GetSeq(), ev.GetRunId(), ev.GetSessionId())
		}
		switch ev.GetType() {
		case wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA:
			calls++
			if tc := ev.GetToolCall(); tc.GetName() != "get_weather" || string(tc.GetArgumentsJson()) != `{"city":"Paris"}` {
				t.Errorf("tool call %v", tc)
			}
		case wirepb.RunEventType_RUN_EVENT_TYPE_USAGE:
			usage++
		}
	}
	if calls != 1 || usage < 1 {
		t.Errorf("%d tool calls and %d usage events, want 1 and at least 1", calls, usage)
	}
	if term.GetUsage().GetCompletionTokens() == 0 || term.GetDoneReason() == "" {
		t.Errorf("terminal without usage or done reason: %v", term)
	}
}

// R10: cancelling one run mid-stream closes its request at the provider;
// another run on the same connection is untouched. Both carry the same
// session id, which links nothing (S1).
func TestCancelMidStreamReachesTheProviderAndSparesOtherRuns(t *testing.T) {
	n := startNode(t, "n1")
	ctx, cancel := context.WithCancel(t.Context())
	a, err := n.edge.srv.Run(ctx, n.id, chat("a", "ollama", slowModel))
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.edge.srv.Run(t.Context(), n.id, chat("b", "ollama", slowModel))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if ev, err := a.Next(); err != nil || ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA {
			t.Fatalf("run a: %v %v", ev, err)
		}
	}
	cancel()
	ev, _ := a.Next()
	for !ev.GetType().IsTerminal() {
		ev, _ = a.Next()
	}
	if ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_CANCELLED {
		t.Errorf("cancelled run ended with %v", ev)
	}
	// The provider sees run a's request closed, promptly.
	wctx, wcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer wcancel()
	if _, err := n.fake.WaitForDisconnect(wctx, requestOf(t, n, "a").ID); err != nil {
		t.Fatalf("the provider never saw the cancelled run's request close: %v", err)
	}
	bEvs := collect(t, b)
	if term := bEvs[len(bEvs)-1]; term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
		t.Fatalf("the other run ended with %v", term)
	}
	if got := strings.Count(textOf(bEvs), " ") + 1; got != 100 {
		t.Errorf("the other run got %d words, want all 100", got)
	}
	if r := requestOf(t, n, "b"); r.Gone() {
		t.Errorf("the other run's provider request was closed early")
	}
}

// A plugin process killed mid-run ends that run with provider_unavailable;
// the plugin is restarted and the next run works.
func TestKilledPluginFailsItsRunThenComesBack(t *testing.T) {
	n := startNode(t, "n1")
	rs, err := n.edge.srv.Run(t.Context(), n.id, chat("k", "ollama", slowModel))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rs.Next(); err != nil {
		t.Fatal(err)
	}
	killed := 0
	for _, pid := range n.pluginPids() {
		if cmdline(pid) == bin.noded+" plugin ollama" {
			syscall.Kill(pid, syscall.SIGKILL)
			killed++
		}
	}
	if killed != 2 {
		t.Fatalf("killed %d ollama plugin processes, want the 2 providers' (children: %v)", killed, n.pluginPids())
	}
	ev, _ := rs.Next()
	for !ev.GetType().IsTerminal() {
		ev, _ = rs.Next()
	}
	if ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_FAILED || ev.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE {
		t.Fatalf("run on a killed plugin ended with %v, want failed provider_unavailable", ev)
	}
	// The Edge learns the provider went offline, then that it is back.
	waitFor(t, "ollama offline at the edge", func() bool { return !n.edge.providerOnline(n.id, "ollama") })
	n.edge.waitProvider(t, n.id, "ollama")
	evs := collect(t, mustRun(t, n, chat("after", "ollama", "llama3.2")))
	if term := evs[len(evs)-1]; term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
		t.Fatalf("run after the restart: %v", term)
	}
}

func mustRun(t *testing.T, n *nodeUnderTest, req *wirepb.RunRequest) *nodeserver.RunStream {
	t.Helper()
	rs, err := n.edge.srv.Run(t.Context(), n.id, req)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// requestOf finds the provider request of run id.
func requestOf(t *testing.T, n *nodeUnderTest, id string) fakeollama.Request {
	t.Helper()
	for _, r := range n.fake.Requests() {
		if r.Path == "/api/chat" && strings.Contains(string(r.Body), "(run "+id+")") {
			return r
		}
	}
	t.Fatalf("the provider received no request for run %s", id)
	return fakeollama.Request{}
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " ")
}

// Over capacity, a run is refused at once; the provider never sees it. An
// invalid stall timeout never reaches the adapter (R4).
func TestOverCapacityAndInvalidStallTimeoutAreRefusedBeforeTheProvider(t *testing.T) {
	n := startNode(t, "n1")
	busy := mustRun(t, n, chat("busy", "ollama-one", slowModel))
	if _, err := busy.Next(); err != nil {
		t.Fatal(err)
	}
	before := len(workOf(n.fake))
	start := time.Now()
	evs := collect(t, mustRun(t, n, chat("over", "ollama-one", slowModel)))
	if term := evs[0]; len(evs) != 1 || term.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED {
		t.Fatalf("over-capacity run: %v", evs)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("refusal took %v: it must not wait for a slot", took)
	}
	bad := chat("bad", "ollama", "llama3.2")
	bad.ResponseStallTimeoutMs = -1
	evs = collect(t, mustRun(t, n, bad))
	if term := evs[0]; len(evs) != 1 || term.GetFailure().GetKind() != wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST {
		t.Fatalf("invalid stall timeout: %v", evs)
	}
	if after := len(workOf(n.fake)); after != before {
		t.Errorf("the provider received %d requests for refused runs", after-before)
	}
}

// A plugin that writes garbage (invalid JSON, half hclog lines, binary) to
// its stderr and stdout does not hurt the Node: the run completes, and the
// next run too.
func TestGarbageFromAPluginDoesNotHurtTheNode(t *testing.T) {
	n := startNode(t, "n1")
	for i := range 3 {
		evs := collect(t, mustRun(t, n, chat(fmt.Sprintf("g%d", i), "scripted", "garbage")))
		if term := evs[len(evs)-1]; term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
			t.Fatalf("garbage run %d: %v", i, term)
		}
	}
	evs := collect(t, mustRun(t, n, chat("after", "scripted", "text:5")))
	if term := evs[len(evs)-1]; term.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED || len(evs) < 6 {
		t.Fatalf("run after garbage: %v", evs)
	}
	if _, err := n.edge.reg.Dispatchable(n.id); err != nil {
		t.Fatalf("node after garbage: %v", err)
	}
}

// No plugin process outlives the Node: after SIGTERM (a drain), and after
// SIGKILL, when nothing in the Node gets to clean up.
func TestNoPluginProcessOutlivesTheNode(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			n := startNode(t, "n1")
			// ollama's plugin stops when idle (idle_stop): a run starts it.
			collect(t, mustRun(t, n, chat("wake", "ollama", "llama3.2")))
			pids := n.pluginPids()
			if len(pids) != 3 {
				t.Fatalf("noded has %d plugin children, want 3: %v", len(pids), pids)
			}
			n.proc.cmd.Process.Signal(sig)
			<-n.proc.done
			waitGone(t, "plugins after "+sig.String()+" of the node", pids)
		})
	}
}
