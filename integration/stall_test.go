package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// Issue 5 end to end: real edged and noded processes over loopback QUIC,
// with real plugin processes, in front of fake Ollama servers that stall
// like a stuck model server (the stream stays open and silent).

const stallModel = "m:latest"

// fleet is one edged and one noded per fake Ollama, each Node serving
// stallModel with the Edge's default profile's stall timeout of 1s.
type fleet struct {
	base  string
	fakes map[string]*fakeollama.Server
}

func startFleet(t *testing.T, ids ...string) *fleet {
	t.Helper()
	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	f := &fleet{base: fmt.Sprintf("http://127.0.0.1:%d", httpPort), fakes: map[string]*fakeollama.Server{}}
	edgeConf := filepath.Join(dir, "edge.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api: {allow_anonymous: true}
profiles:
  - {name: default, deadline: 1m, queue_timeout: 2s, response_stall_timeout: 1s}
log: {level: debug}
`, quicPort, httpPort))
	start(t, "edged", bin.edged, "run", "--config", edgeConf)
	for _, id := range ids {
		fake := fakeollama.New(fakeollama.Model{Name: stallModel, TokenCount: 5})
		t.Cleanup(fake.Close)
		f.fakes[id] = fake
		conf := filepath.Join(dir, id+".yaml")
		writeFile(t, conf, fmt.Sprintf(`
node_id: %s
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
providers: [{name: ollama, adapter: ollama, capacity: 4, targets: [%q], config: {base_url: %q}}]
log: {level: debug}
`, id, quicPort, stallModel, fake.URL()))
		start(t, "noded "+id, bin.noded, "run", "--config", conf)
		waitNode(t, f.base, id, "ready", func(n nodeView) bool { return n.State == "ready" && n.Providers[0].State == "online" })
	}
	return f
}

// stall makes node id's model stall after n lines (0: before the head).
func (f *fleet) stall(id string, after int) {
	f.fakes[id].SetModel(fakeollama.Model{Name: stallModel, TokenCount: 5, Stall: true, StallAfter: after})
}

func (f *fleet) heal(id string) {
	f.fakes[id].SetModel(fakeollama.Model{Name: stallModel, TokenCount: 5})
}

const chatJSON = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`

// sse posts a streamed chat completion and returns the status, the
// X-IOP-Liveness header, the content received and the error event, if any.
func (f *fleet) sse(t *testing.T, onFirstChunk func()) (status int, liveness, content, errMsg string) {
	t.Helper()
	resp, err := http.Post(f.base+"/v1/chat/completions", "application/json", strings.NewReader(chatJSON))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		var e struct {
			Error struct{ Message, Code string }
		}
		_ = json.Unmarshal(b, &e)
		return resp.StatusCode, resp.Header.Get("X-IOP-Liveness"), "", e.Error.Message
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ev struct {
			Choices []struct {
				Delta struct{ Content string }
			}
			Error *struct{ Message, Code string }
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("bad SSE data %q: %v", data, err)
		}
		if ev.Error != nil {
			errMsg = ev.Error.Message
			continue
		}
		for _, c := range ev.Choices {
			if content == "" && c.Delta.Content != "" && onFirstChunk != nil {
				onFirstChunk()
			}
			content += c.Delta.Content
		}
	}
	return resp.StatusCode, "", content, errMsg
}

func (f *fleet) metric(t *testing.T, series string) bool {
	t.Helper()
	resp, err := http.Get(f.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(b), series)
}

// metricValue is the value of series in the Edge's /metrics, 0 when it is
// not there.
func (f *fleet) metricValue(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := http.Get(f.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return metricValue(string(b), series)
}

func (f *fleet) provider(t *testing.T, id string) (unhealthy []string, stalls map[string]uint64) {
	for _, n := range adminNodes(t, f.base) {
		if n.ID == id {
			return n.Providers[0].UnhealthyTargets, n.Providers[0].Stalls
		}
	}
	t.Fatalf("node %s not in the admin view", id)
	return nil, nil
}

// R5, R6 through the OpenAI API: a stream that stalls after output ends in
// an error event carrying the evidence: available/request_stalled while
// the server answers its probe; unavailable/provider_unhealthy when it is
// down for the probe too, and then the target leaves selection until the
// Node's recovery probe finds it back.
func TestStallEvidenceReachesTheClientAndSelection(t *testing.T) {
	f := startFleet(t, "n1")
	f.stall("n1", 2)

	status, _, content, errMsg := f.sse(t, nil)
	if status != 200 || content == "" || !strings.Contains(errMsg, "provider health available, classification request_stalled") {
		t.Fatalf("stall after output: status %d, content %q, error event %q", status, content, errMsg)
	}
	if !f.metric(t, `iop_edge_stalls_total{classification="request_stalled"} 1`) {
		t.Error("the stall was not counted by classification")
	}
	if _, stalls := f.provider(t, "n1"); stalls[stallModel] != 1 {
		t.Errorf("stalls against the target = %v, want 1", stalls)
	}
	// A request that completes there (here a raw tunnel) clears the count.
	f.heal("n1")
	resp, err := http.Post(f.base+"/api/chat", "application/json", strings.NewReader(chatJSON))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"done":true`) {
		t.Fatalf("tunnel after healing: %d %s", resp.StatusCode, b)
	}
	if _, stalls := f.provider(t, "n1"); stalls[stallModel] != 0 {
		t.Errorf("stalls against the target after a completed request = %v, want none", stalls)
	}
	f.stall("n1", 2)

	// Down for the probe too: the server stops answering new requests
	// while the stream it already serves is stuck.
	down := func() {
		if err := f.fakes["n1"].SetMode(fakeollama.ModeUnavailable); err != nil {
			t.Error(err)
		}
	}
	status, _, content, errMsg = f.sse(t, down)
	if status != 200 || content == "" || !strings.Contains(errMsg, "provider health unavailable, classification provider_unhealthy") {
		t.Fatalf("stall with the server down: status %d, content %q, error event %q", status, content, errMsg)
	}
	if unhealthy, _ := f.provider(t, "n1"); !slices.Contains(unhealthy, stallModel) {
		t.Fatalf("unhealthy targets = %v: the target did not leave selection", unhealthy)
	}
	status, _, _, errMsg = f.sse(t, nil)
	if status != http.StatusServiceUnavailable || !strings.Contains(strings.ToLower(errMsg), "no candidate") {
		t.Fatalf("request for an unhealthy-only model: status %d, %q; want 503 no candidate", status, errMsg)
	}

	// Recovery: the server is back; the Node's recovery probe reports the
	// target back and it serves again.
	f.heal("n1")
	if err := f.fakes["n1"].SetMode(fakeollama.ModeUp); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the target back in selection", func() bool {
		unhealthy, _ := f.provider(t, "n1")
		return len(unhealthy) == 0
	})
	status, _, content, errMsg = f.sse(t, nil)
	if status != 200 || content == "" || errMsg != "" {
		t.Fatalf("after recovery: status %d, content %q, error %q", status, content, errMsg)
	}
	if !f.metric(t, `iop_edge_stalls_total{classification="provider_unhealthy"} 1`) {
		t.Error("the provider_unhealthy stall was not counted")
	}
}

// Recovery: a run that stalls before its first byte, with the provider
// call confirmed closed, moves once to another Node and the client gets a
// normal answer, through both client APIs (a normalized run and a raw
// tunnel). A stall with nowhere else to go is a 504 with the evidence.
func TestStalledRunMovesToAnotherNode(t *testing.T) {
	f := startFleet(t, "n1", "n2")
	f.stall("n1", 0)
	for i := range 4 {
		status, _, content, errMsg := f.sse(t, nil)
		if status != 200 || content == "" || errMsg != "" {
			t.Fatalf("request %d: status %d, content %q, error %q", i, status, content, errMsg)
		}
		resp, err := http.Post(f.base+"/api/chat", "application/json", strings.NewReader(chatJSON))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || strings.Contains(string(b), `"error"`) || !strings.Contains(string(b), `"done":true`) {
			t.Fatalf("tunnel %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if f.metricValue(t, `iop_edge_failovers_total{reason="response_stalled"}`) == 0 {
		t.Fatal("no request was moved for a stall: the test did not exercise recovery")
	}
	gone := 0
	for _, r := range f.fakes["n1"].Requests() {
		if r.Path == "/api/chat" && r.Gone() {
			gone++
		}
	}
	if gone == 0 {
		t.Error("the stalled requests on n1 were not closed (the provider call must be cancelled)")
	}

	// Both stall: one retry, then the client gets 504 and the evidence.
	f.stall("n2", 0)
	status, liveness, _, errMsg := f.sse(t, nil)
	if status != http.StatusGatewayTimeout || liveness != "request_stalled" || !strings.Contains(errMsg, "no progress for") {
		t.Fatalf("stall everywhere: status %d, liveness %q, error %q", status, liveness, errMsg)
	}
}

// The raw tunnel (the Ollama API) stalls after output: the client gets
// Ollama's in-stream error line with the evidence, after the lines it got.
func TestTunnelStallAfterOutputIsAnErrorLine(t *testing.T) {
	f := startFleet(t, "n1")
	f.stall("n1", 2)
	resp, err := http.Post(f.base+"/api/chat", "application/json", strings.NewReader(chatJSON))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if resp.StatusCode != 200 || len(lines) != 3 {
		t.Fatalf("status %d, body %s; want 200 with 2 lines and an error line", resp.StatusCode, b)
	}
	var last struct{ Error string }
	if err := json.Unmarshal([]byte(lines[2]), &last); err != nil || !strings.Contains(last.Error, "classification request_stalled") {
		t.Fatalf("last line %q: %v", lines[2], err)
	}
	if !f.metric(t, `iop_edge_stalls_total{classification="request_stalled"} 1`) {
		t.Error("the tunnel stall was not counted")
	}
}
