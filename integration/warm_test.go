package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// warmFleet is a real edged and one real noded per fake Ollama, on
// loopback: each Node's one ollama provider reports what its fake holds
// loaded (issue 23).
type warmFleet struct {
	base  string
	edge  *proc
	fakes []*fakeollama.Server
}

// startWarmFleet starts an Edge, routing warm first or not, and Nodes
// n1, n2, ... in front of fakes, each provider of capacity capacity and
// max_loaded_models maxLoaded.
func startWarmFleet(t *testing.T, warmFirst bool, capacity, maxLoaded int, fakes ...*fakeollama.Server) *warmFleet {
	t.Helper()
	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	edgeConf := filepath.Join(dir, "edge.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
edge_id: edge-1
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api: {allow_anonymous: true}
scheduling: {warm_first: %t}
log: {level: debug}
profiles:
  - {name: default, deadline: 5m, queue_timeout: 3m, max_queue_depth: 256, idle_timeout: 2m}
`, quicPort, httpPort, warmFirst))
	f := &warmFleet{base: fmt.Sprintf("http://127.0.0.1:%d", httpPort), fakes: fakes}
	f.edge = start(t, "edged", bin.edged, "run", "--config", edgeConf)
	for i, fake := range fakes {
		id := fmt.Sprintf("n%d", i+1)
		conf := filepath.Join(dir, id+".yaml")
		writeFile(t, conf, fmt.Sprintf(`
node_id: %s
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
providers:
  - {name: ollama, adapter: ollama, capacity: %d, max_loaded_models: %d, config: {base_url: %q}}
`, id, quicPort, capacity, maxLoaded, fake.URL()))
		start(t, id, bin.noded, "run", "--config", conf)
		waitNode(t, f.base, id, "ready with ollama online", func(n nodeView) bool {
			return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
		})
	}
	return f
}

// loadedOn is what the Edge's admin view says node's provider holds loaded.
func (f *warmFleet) loadedOn(t *testing.T, node string) (names []string, known bool) {
	t.Helper()
	resp, err := http.Get(f.base + "/admin/v1/nodes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Nodes []struct {
			ID        string `json:"id"`
			Providers []struct {
				Loaded *struct {
					Max    int `json:"max"`
					Models []struct {
						Name string `json:"name"`
						Size uint64 `json:"size"`
					} `json:"models"`
				} `json:"loaded"`
			} `json:"providers"`
		} `json:"nodes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	for _, n := range body.Nodes {
		if n.ID != node || len(n.Providers) == 0 || n.Providers[0].Loaded == nil {
			continue
		}
		l := n.Providers[0].Loaded
		for _, m := range l.Models {
			if m.Size == 0 || l.Max == 0 {
				t.Errorf("%s's loaded view %+v: want sizes and a max", node, l)
			}
			names = append(names, m.Name)
		}
		return names, true
	}
	return nil, false
}

// waitLoaded waits until the Edge sees node's provider holding exactly
// models.
func (f *warmFleet) waitLoaded(t *testing.T, node string, models ...string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s reported holding %v", node, models), func() bool {
		names, known := f.loadedOn(t, node)
		return known && slices.Equal(names, models)
	})
}

// chat sends one streamed /api/chat for model to the Edge and returns the
// time to its first token; it fails the test unless the answer completes.
func (f *warmFleet) chat(t *testing.T, model string) time.Duration {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}]}`, model)
	sent := time.Now()
	resp, err := http.Post(f.base+"/api/chat", "application/json", strings.NewReader(body))
	if err != nil {
		t.Errorf("chat %s: %v", model, err)
		return 0
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Errorf("chat %s: %d %s", model, resp.StatusCode, b)
		return 0
	}
	var ttft time.Duration
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var line struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			Done  bool   `json:"done"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil || line.Error != "" {
			t.Errorf("chat %s: line %s (%v)", model, sc.Bytes(), err)
			return 0
		}
		if ttft == 0 && line.Message.Content != "" {
			ttft = time.Since(sent)
		}
		done = done || line.Done
	}
	if !done {
		t.Errorf("chat %s: the answer ended without its done line (%v)", model, sc.Err())
	}
	return ttft
}

// chatsFor counts the /api/chat requests fake received for model.
func chatsFor(fake *fakeollama.Server, model string) int {
	n := 0
	for _, r := range fake.Requests() {
		if r.Path == "/api/chat" && strings.TrimSuffix(r.Model, ":latest") == model {
			n++
		}
	}
	return n
}

// twoModels are the models of the warm tests: a short answer each.
func twoModels(tokenDelay time.Duration) []fakeollama.Model {
	return []fakeollama.Model{
		{Name: "alpha:latest", TokenCount: 8, TokenDelay: tokenDelay, Seed: 1},
		{Name: "beta:latest", TokenCount: 8, TokenDelay: tokenDelay, Seed: 2},
	}
}

// Issue 23, P9: two Nodes whose model servers hold one model each, with
// room for a second (max_loaded_models 2; a second to load one): requests
// for each model go to the Node holding it, so neither server loads
// anything; a hot model spills past the bounded load to the other Node,
// which loads it beside its own. Said in the request's log line and
// iop_edge_route_choices_total.
func TestRequestsGoWhereTheirModelIsLoaded(t *testing.T) {
	fakes := make([]*fakeollama.Server, 2)
	for i, preload := range []string{"alpha", "beta"} {
		fakes[i] = fakeollama.New(twoModels(100 * time.Millisecond)...)
		t.Cleanup(fakes[i].Close)
		fakes[i].SetLoading(fakeollama.Loading{MaxLoaded: 2, LoadTime: time.Second})
		// Loaded before the Nodes start: a load request, as `ollama run` sends.
		resp, err := http.Post(fakes[i].URL()+"/api/generate", "application/json", strings.NewReader(fmt.Sprintf(`{"model":%q}`, preload)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		fakes[i].Reset()
	}
	f := startWarmFleet(t, true, 4, 2, fakes...)
	f.waitLoaded(t, "n1", "alpha:latest")
	f.waitLoaded(t, "n2", "beta:latest")

	for range 4 {
		f.chat(t, "alpha")
		f.chat(t, "beta")
	}
	if a1, a2, b1, b2 := chatsFor(fakes[0], "alpha"), chatsFor(fakes[1], "alpha"), chatsFor(fakes[0], "beta"), chatsFor(fakes[1], "beta"); a1 != 4 || b2 != 4 || a2 != 0 || b1 != 0 {
		t.Fatalf("alpha went %d/%d and beta %d/%d to n1/n2: want each to the Node holding it", a1, a2, b1, b2)
	}
	for i, fake := range fakes {
		if st := fake.Loads(); st.Loads != 1 {
			t.Errorf("n%d's server loaded %d times (%v), want only its first load", i+1, st.Loads, st.ByModel)
		}
	}
	metrics := scrapeText(t, f.base+"/metrics")
	if warm := metricValue(metrics, `iop_edge_route_choices_total{reason="warm"}`); warm != 8 {
		t.Errorf("warm choices %v, want 8:\n%s", warm, grepLines(metrics, "iop_edge_route_choices_total"))
	}
	if !strings.Contains(f.edge.out.String(), "choice=warm") {
		t.Errorf("no request log line says choice=warm:\n%s", grepLines(f.edge.out.String(), "node=n1"))
	}

	// Alpha gets hot: eight at once, each streaming for most of a second.
	// n1 takes three (3 of 4 slots busy is past WarmSlack beside an idle
	// n2 with room), the rest spill to n2, which loads alpha beside beta.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { f.chat(t, "alpha") })
	}
	wg.Wait()
	if a2 := chatsFor(fakes[1], "alpha"); a2 == 0 {
		t.Errorf("none of eight alphas at once spilled to n2")
	}
	if st := fakes[1].Loads(); st.ByModel["alpha:latest"] != 1 || st.Evictions != 0 {
		t.Errorf("n2's server loads %v, %d evictions: want alpha loaded once for the spill, beside beta", st.ByModel, st.Evictions)
	}
	metrics = scrapeText(t, f.base+"/metrics")
	if spill := metricValue(metrics, `iop_edge_route_choices_total{reason="spill"}`); spill != 1 {
		t.Errorf("spill choices %v, want 1 (the first to n2; the rest are warm there):\n%s", spill, grepLines(metrics, "iop_edge_route_choices_total"))
	}
	if !strings.Contains(f.edge.out.String(), "choice=spill") {
		t.Errorf("no request log line says choice=spill")
	}
	f.waitLoaded(t, "n2", "alpha:latest", "beta:latest")

	// The status page shows what each server holds (in a browser, when
	// there is one; CI has one, see requireBrowser).
	if findBrowser() == "" && os.Getenv("IOP_REQUIRE_BROWSER") == "" {
		return
	}
	page := openStatusPage(t, requireBrowser(t), f.base)
	page.wait("n2's server holding alpha and beta", 15*time.Second, func(v pageView) bool {
		for _, n := range v.Nodes {
			for _, p := range n.Providers {
				if n.ID == "n2" && strings.Contains(p.Text, "loaded (at most 2): alpha:latest") && strings.Contains(p.Text, "beta:latest") &&
					strings.Contains(p.Text, "unloads in") {
					return true
				}
			}
		}
		return false
	})
}
