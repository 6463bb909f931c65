package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// P5, issue 24: the two reload rules, on the real daemons: a key removed by a
// reload refuses every new request at once, and the stream it started
// before runs to its end (decided: a reload that rotates keys cuts no
// answer short; the profile's deadline bounds what runs on); a reload
// that would leave no admin key is refused, by the endpoint and by
// SIGHUP, and the admin's key keeps working.
func TestReloadRulesForKeys(t *testing.T) {
	const opsKey, bobKey = "sk-ops-reload-keys-0001", "sk-bob-reload-keys-0002"
	slow := fakeollama.Model{Name: "slow:latest", Text: strings.TrimSpace(strings.Repeat("word ", 30)), TokenDelay: 60 * time.Millisecond}
	fake := fakeollama.New(slow)
	t.Cleanup(fake.Close)

	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	conf := filepath.Join(dir, "edge.yaml")
	write := func(keys string, opsAdmin bool) {
		t.Helper()
		writeFile(t, conf+".tmp", fmt.Sprintf(`
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api: {keys: [%s]}
principals: [{name: ops, routes: ['*'], admin: %t}, {name: bob, routes: ['*']}]
`, quicPort, httpPort, keys, opsAdmin))
		if err := os.Rename(conf+".tmp", conf); err != nil {
			t.Fatal(err)
		}
	}
	ops := fmt.Sprintf("{principal: ops, sha256: %s}", auth.HashKey(opsKey))
	bob := fmt.Sprintf("{principal: bob, sha256: %s}", auth.HashKey(bobKey))
	write(ops+", "+bob, true)
	edge := start(t, "edged", bin.edged, "run", "--config", conf)
	nodeConf := filepath.Join(dir, "node.yaml")
	writeFile(t, nodeConf, fmt.Sprintf(`
node_id: n1
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
providers: [{name: ollama, adapter: ollama, config: {base_url: %q}}]
`, quicPort, fake.URL()))
	start(t, "noded", bin.noded, "run", "--config", nodeConf)
	waitFor(t, "n1 ready", func() bool {
		req, _ := http.NewRequest(http.MethodGet, base+"/admin/v1/nodes", nil)
		req.Header.Set("Authorization", "Bearer "+opsKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body struct{ Nodes []nodeView }
		return json.NewDecoder(resp.Body).Decode(&body) == nil && len(body.Nodes) == 1 && body.Nodes[0].State == "ready" &&
			len(body.Nodes[0].Providers) == 1 && body.Nodes[0].Providers[0].State == "online"
	})
	chat := func(key string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/api/chat",
			strings.NewReader(`{"model":"slow:latest","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		return http.DefaultClient.Do(req)
	}

	// Bob's stream starts; then his key is removed.
	resp, err := chat(bobKey)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("bob's stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	if !lines.Scan() {
		t.Fatalf("bob's stream gave nothing: %v", lines.Err())
	}
	var text strings.Builder
	var done bool
	take := func(line string) {
		var c struct {
			Message struct{ Content string }
			Done    bool
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Errorf("line %q: %v", line, err)
		}
		text.WriteString(c.Message.Content)
		done = done || c.Done
	}
	take(lines.Text())

	write(ops, true)
	code, answer := reloadAs(t, base, opsKey)
	if code != http.StatusOK || !strings.Contains(fmt.Sprint(answer["changes"]), "api.keys: 2 -> 1") {
		t.Fatalf("reload removing bob's key: %d %v", code, answer)
	}
	if r, err := chat(bobKey); err != nil || r.StatusCode != http.StatusUnauthorized {
		t.Errorf("bob's next request after his key was removed: %v %v; want 401", r.Status, err)
	} else {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	for lines.Scan() {
		take(lines.Text())
	}
	if err := lines.Err(); err != nil || !done || strings.TrimSpace(text.String()) != slow.Text {
		t.Errorf("bob's stream across the removal of his key: %q, done %t, %v; want the whole answer", text.String(), done, err)
	}

	// The last admin key: its principal made no admin, then the key removed.
	for _, tt := range []struct {
		name     string
		keys     string
		opsAdmin bool
	}{
		{"admin taken from ops", ops, false},
		{"ops's key removed", bob, true},
	} {
		write(tt.keys, tt.opsAdmin)
		code, answer := reloadAs(t, base, opsKey)
		if msg := fmt.Sprint(answer["error"]); code != http.StatusUnprocessableEntity || answer["applied"] != false ||
			!strings.Contains(msg, "no API key of an admin principal") || !strings.Contains(msg, "restart") {
			t.Errorf("%s: reload = %d %v; want 422 naming the lost admin key and the restart", tt.name, code, answer)
		}
	}
	if err := edge.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	edge.waitOutput(regexp.MustCompile(`config reload refused.*by=SIGHUP.*no API key of an admin principal`))
	// ops is still the admin: fixing the file and reloading works.
	write(ops, true)
	if code, answer := reloadAs(t, base, opsKey); code != http.StatusOK {
		t.Errorf("reload by ops after the refusals: %d %v", code, answer)
	}
}

// reloadAs asks the Edge at base to reload with key, and returns the
// status and the answer.
func reloadAs(t *testing.T, base, key string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/admin/v1/reload", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("reload answer (%s): %v", resp.Status, err)
	}
	return resp.StatusCode, body
}
