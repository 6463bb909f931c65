package integration

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
)

// Issue 6 end to end, in managed mode (mutual TLS): real edged and noded
// processes over loopback QUIC, the OpenAI-compatible adapter as a real
// plugin process, and a fake OpenAI server that requires a bearer key. The
// key lives only in the Edge's credential file; each run carries it to the
// Node in a sealed lease (R11, S3, S4).

const (
	upstreamKey = "sk-upstream-5c1e7a0b9d"
	opsKey      = "ops-key-for-the-admin-api"
	appKey      = "app-key-for-clients"
)

type managedLeaseStack struct {
	base     string
	fake     *fakeopenai.Server
	edge     *proc
	node     *proc
	nodeConf string
	dir      string
}

func startManagedLeaseStack(t *testing.T) *managedLeaseStack {
	t.Helper()
	fake := fakeopenai.Start(fakeopenai.Config{APIKey: upstreamKey, Models: []fakeopenai.Model{
		{Name: "gpt-test", TokenCount: 5},
		{Name: "gpt-slow", TokenCount: 20, Delay: 100 * time.Millisecond},
	}})
	t.Cleanup(fake.Close)
	dir, edgeConf, nodeConf, base, _ := managedSetup(t, "n1")
	writeFile(t, filepath.Join(dir, "upstream.key"), upstreamKey+"\n")
	appendFile(t, edgeConf, fmt.Sprintf(`
credentials:
  - {name: upstream, file: upstream.key}
profiles:
  - {name: default, credential: upstream, queue_timeout: 2s}
principals:
  - {name: ops, routes: ["*"], admin: true}
  - {name: app, routes: ["*"]}
api:
  admin_reads: open  # the tests read /admin/v1/nodes without a key
  keys:
    - {principal: ops, sha256: %s}
    - {principal: app, sha256: %s}
log: {level: debug}
`, auth.HashKey(opsKey), auth.HashKey(appKey)))
	appendFile(t, nodeConf, fmt.Sprintf(`
providers:
  - {name: hosted, adapter: openai, capacity: 4, targets: [gpt-test, gpt-slow], config: {base_url: %q}}
log: {level: debug}
`, fake.URL()+"/v1"))
	s := &managedLeaseStack{base: base, fake: fake, nodeConf: nodeConf, dir: dir}
	s.edge = start(t, "edged", bin.edged, "run", "--config", edgeConf)
	s.node = start(t, "noded", bin.noded, "run", "--config", nodeConf)
	waitNode(t, base, "n1", "ready with hosted online", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
	})
	return s
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// chat streams one chat completion with key and returns the status, the
// content and the raw body (error bodies included). onChunk, if set, is
// called at the first content chunk.
func (s *managedLeaseStack) chat(t *testing.T, key, model string, onChunk func()) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.base+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+model+`","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body, content strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		body.WriteString(line + "\n")
		if data, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(data, `"content":"`) {
			if content.Len() == 0 && onChunk != nil {
				onChunk()
			}
			content.WriteString("x")
		}
	}
	return resp.StatusCode, content.String(), body.String()
}

func (s *managedLeaseStack) admin(t *testing.T, key, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.base+path, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (s *managedLeaseStack) upstreamChats() int {
	n := 0
	for _, r := range s.fake.Requests() {
		if strings.HasSuffix(r.Path, "/chat/completions") {
			n++
		}
	}
	return n
}

// R11, S3: a keyed provider works through a Node that never holds the key:
// not in its config, not on its disk, not in its environment or logs.
// Revoking the credential mid-way lets the run already inside the provider
// finish, and fails the next one closed: no lease, no provider call.
func TestManagedLeaseCarriesTheKeyThatNeverRestsOnTheNode(t *testing.T) {
	s := startManagedLeaseStack(t)

	status, content, body := s.chat(t, appKey, "gpt-test", nil)
	if status != 200 || content == "" || !strings.Contains(body, "[DONE]") {
		t.Fatalf("chat through a lease: %d %q\n%s", status, content, body)
	}
	reqs := s.fake.Requests()
	if len(reqs) == 0 || reqs[len(reqs)-1].Header.Get("Authorization") != "Bearer "+upstreamKey {
		t.Fatalf("the provider did not get the leased key: %v", reqs)
	}

	// Nothing of the Node's holds the key.
	nodeFiles := []string{s.nodeConf, filepath.Join(s.dir, "node-lease.key"), filepath.Join(s.dir, "node-n1.pem"), filepath.Join(s.dir, "node-n1-key.pem")}
	for _, f := range nodeFiles {
		if strings.Contains(readFile(t, f), upstreamKey) {
			t.Errorf("%s holds the key", f)
		}
	}
	pids := append([]int{s.node.cmd.Process.Pid}, children(s.node.cmd.Process.Pid)...)
	for _, pid := range pids {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err == nil && strings.Contains(string(env), upstreamKey) {
			t.Errorf("process %d has the key in its environment", pid)
		}
	}
	for name, out := range map[string]string{"noded": s.node.out.String(), "edged": s.edge.out.String()} {
		if strings.Contains(out, upstreamKey) {
			t.Errorf("%s logged the key", name)
		}
	}

	// Only an admin may revoke.
	if code, _ := s.admin(t, appKey, "/admin/v1/credentials/upstream/revoke"); code != http.StatusForbidden {
		t.Errorf("revoke with a client key: %d, want 403", code)
	}

	// Revoke while a run is inside the provider: that run finishes.
	revoked := make(chan string, 1)
	status, content, body = s.chat(t, appKey, "gpt-slow", func() {
		code, b := s.admin(t, opsKey, "/admin/v1/credentials/upstream/revoke")
		revoked <- fmt.Sprintf("%d %s", code, b)
	})
	if r := <-revoked; !strings.HasPrefix(r, "200") {
		t.Fatalf("revoke: %s", r)
	}
	if status != 200 || len(content) < 20 || !strings.Contains(body, "[DONE]") || strings.Contains(body, `"error"`) {
		t.Fatalf("the run inside the provider did not finish after the revoke: %d, %d chunks\n%s", status, len(content), body)
	}
	waitFor(t, "the Node learning of the revocation", func() bool {
		return strings.Contains(s.node.out.String(), "credential notice")
	})

	// The next run fails closed: no lease is issued, the provider is not
	// called.
	before := s.upstreamChats()
	status, _, body = s.chat(t, appKey, "gpt-test", nil)
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "credential_unavailable") || !strings.Contains(body, "revoked") {
		t.Fatalf("run after the revoke: %d\n%s", status, body)
	}
	if s.upstreamChats() != before {
		t.Fatal("the provider was called after the credential was revoked")
	}

	// Reloading the credential (its file holds the new secret) serves
	// again, under a higher revision.
	if code, b := s.admin(t, opsKey, "/admin/v1/credentials/upstream/reload"); code != 200 {
		t.Fatalf("reload: %d %s", code, b)
	}
	if status, content, body = s.chat(t, appKey, "gpt-test", nil); status != 200 || content == "" {
		t.Fatalf("run after the reload: %d\n%s", status, body)
	}

	// Disabling the profile stops it again, before any provider call.
	if code, b := s.admin(t, opsKey, "/admin/v1/profiles/default/disable"); code != 200 {
		t.Fatalf("disable: %d %s", code, b)
	}
	before = s.upstreamChats()
	if status, _, body = s.chat(t, appKey, "gpt-test", nil); status != http.StatusServiceUnavailable || !strings.Contains(body, "disabled") {
		t.Fatalf("run with the profile disabled: %d\n%s", status, body)
	}
	if s.upstreamChats() != before {
		t.Fatal("the provider was called with the profile disabled")
	}
}
