package integration

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// A Node that refuses before the first byte (its model server is down, so
// the run fails provider_unavailable) does not fail the request: the work
// moves to the other candidate, and the failover is counted.
func TestWorkMovesToAnotherNodeBeforeTheFirstByte(t *testing.T) {
	model := fakeollama.Model{Name: "m:latest", TokenCount: 5}
	down, up := fakeollama.New(model), fakeollama.New(model)
	defer down.Close()
	defer up.Close()
	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	edgeConf := filepath.Join(dir, "edge.yaml")
	writeFile(t, edgeConf, fmt.Sprintf("listen: {quic: \"127.0.0.1:%d\", http: \"127.0.0.1:%d\"}\nidentity: {mode: loopback}\napi: {allow_anonymous: true}\n", quicPort, httpPort))
	start(t, "edged", bin.edged, "run", "--config", edgeConf)
	for id, f := range map[string]*fakeollama.Server{"n1": down, "n2": up} {
		conf := filepath.Join(dir, id+".yaml")
		writeFile(t, conf, fmt.Sprintf(`
node_id: %s
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
providers: [{name: ollama, adapter: ollama, capacity: 4, targets: ["m:latest"], config: {base_url: %q}}]
`, id, quicPort, f.URL()))
		start(t, "noded "+id, bin.noded, "run", "--config", conf)
		waitNode(t, base, id, "ready", func(n nodeView) bool { return n.State == "ready" && n.Providers[0].State == "online" })
	}
	if err := down.SetMode(fakeollama.ModeRefuse); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "[DONE]") || strings.Contains(string(b), `"error"`) {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if metricValue(string(m), `iop_edge_failovers_total{reason="before_first_byte"}`) == 0 {
		t.Errorf("no failover was counted in 6 requests spread over two nodes:\n%s", grepLines(string(m), "iop_edge_"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
