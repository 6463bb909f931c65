package integration

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"golang.org/x/crypto/ssh"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// Issue 23: "the ollama CLI pointed at the Edge pulls and removes models on the fleet". The CLI
// sends no API key; with OLLAMA_AUTH=1 it signs each request with ~/.ollama/id_ed25519, and a
// principal that lists the public key in its ollama_keys is who the request comes from. Here
// the official client, made by api.ClientFromEnvironment as the CLI makes it, with OLLAMA_HOST
// at the Edge and HOME holding the key: an admin's key pulls onto the Node's server, chats
// (every Ollama route, so `OLLAMA_AUTH=1 ollama run` works), lists and deletes; a user's key
// lists but may not pull; a key nobody lists gets 401, logged with its fingerprint; a signature
// sent again from another address is refused as a replay.

// ollamaHome makes a home directory holding a new ~/.ollama/id_ed25519 (OpenSSH private key
// format, as Ollama writes it) and returns it with the public key's authorized_keys line.
func ollamaHome(t *testing.T, comment string) (home, pubLine string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	home = t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".ollama"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".ollama", "id_ed25519"), pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return home, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub))) + " " + comment
}

// asOllamaUser is the official client of the user whose home is home, signing with its key,
// made from the environment as the ollama CLI makes it. The environment stays set until the
// test ends or the next call: the client reads HOME at every request.
func asOllamaUser(t *testing.T, base, home string) *api.Client {
	t.Helper()
	t.Setenv("OLLAMA_HOST", base)
	t.Setenv("OLLAMA_AUTH", "1")
	t.Setenv("HOME", home)
	c, err := api.ClientFromEnvironment()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// recordingTransport keeps the last request it sent.
type recordingTransport struct {
	mu   sync.Mutex
	last *http.Request
}

func (rt *recordingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rt.mu.Lock()
	rt.last = r.Clone(r.Context())
	rt.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

func TestOllamaCLIKeyManagesTheFleet(t *testing.T) {
	adminHome, adminKey := ollamaHome(t, "ops@laptop")
	userHome, userKey := ollamaHome(t, "dev@desk")
	strangerHome, _ := ollamaHome(t, "stranger@nowhere")

	fake := fakeollama.New(fakeollama.Model{Name: "base:latest", Text: "base answers"})
	defer fake.Close()
	fake.SetPullStep(2 * time.Millisecond)
	fake.SetPullable(fakeollama.Pullable{Model: fakeollama.Model{Name: "tiny", Text: "tiny answers"}, Blobs: []int64{1 << 20}})

	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	edgeConf := filepath.Join(dir, "edge.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api:
  allow_anonymous: false
  admin_reads: open
principals:
  - {name: ops, routes: ["*"], admin: true, ollama_keys: [%q]}
  - {name: dev, routes: ["*"], ollama_keys: [%q]}
`, quicPort, httpPort, adminKey, userKey))
	edge := start(t, "edged", bin.edged, "run", "--config", edgeConf)
	nodeConf := filepath.Join(dir, "n1.yaml")
	writeFile(t, nodeConf, fmt.Sprintf(`
node_id: n1
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
providers:
  - {name: ollama, adapter: ollama, capacity: 1, relist_interval: 1h, config: {base_url: %q}}
`, quicPort, fake.URL()))
	start(t, "noded-n1", bin.noded, "run", "--config", nodeConf)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	waitNode(t, base, "n1", "ready with ollama online", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
	})

	// The admin's key: pull, list, chat, show, delete.
	admin := asOllamaUser(t, base, adminHome)
	var pull pullLog
	if err := admin.Pull(t.Context(), &api.PullRequest{Model: "tiny"}, pull.fn); err != nil {
		t.Fatalf("pull signed with the admin's key: %v", err)
	}
	if statuses, _ := pull.node("n1"); len(statuses) == 0 || statuses[len(statuses)-1] != "success" {
		t.Errorf("n1's progress: %q", statuses)
	}
	waitTags(t, admin, "tiny listed", time.Second, func(names []string) bool { return slices.Contains(names, "tiny:latest") })
	var text string
	if err := admin.Chat(t.Context(), &api.ChatRequest{Model: "tiny", Messages: []api.Message{{Role: "user", Content: "hi"}}}, func(r api.ChatResponse) error {
		text += r.Message.Content
		return nil
	}); err != nil || text != "tiny answers" {
		t.Errorf("chat signed with the admin's key: %q, %v", text, err)
	}
	if _, err := admin.Show(t.Context(), &api.ShowRequest{Model: "tiny"}); err != nil {
		t.Errorf("show signed with the admin's key: %v", err)
	}
	// The signature stays at the Edge; the signed ts, harmless without it (Ollama ignores
	// query parameters it does not know), goes on with a relayed request's query.
	for _, r := range fake.Requests() {
		if r.Header.Get("Authorization") != "" {
			t.Errorf("%s %s reached the Node's server with the client's Authorization", r.Method, r.Path)
		}
		if r.Path == "/api/show" {
			t.Logf("the Node's server got %s %s?%s", r.Method, r.Path, r.Query)
		}
	}
	// `ollama rm tiny base`: two deletes back to back, which carry the same signature when the
	// client signs them within one second.
	rec := &recordingTransport{}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	recorded := api.NewClient(u, &http.Client{Transport: rec})
	var signatures []string
	for _, m := range []string{"tiny", "base"} {
		if err := recorded.Delete(t.Context(), &api.DeleteRequest{Model: m}); err != nil {
			t.Fatalf("delete %s signed with the admin's key: %v", m, err)
		}
		signatures = append(signatures, rec.last.Header.Get("Authorization"))
	}
	t.Logf("the two deletes were signed alike: %v", signatures[0] == signatures[1])
	waitTags(t, admin, "tiny and base gone", time.Second, func(names []string) bool { return len(names) == 0 })

	// A user's key: served, but not an admin.
	user := asOllamaUser(t, base, userHome)
	if _, err := user.List(t.Context()); err != nil {
		t.Errorf("list signed with a user's key: %v", err)
	}
	var se api.StatusError
	if err := user.Pull(t.Context(), &api.PullRequest{Model: "tiny"}, func(api.ProgressResponse) error { return nil }); !errors.As(err, &se) || se.StatusCode != http.StatusForbidden {
		t.Errorf("pull signed with a user's key: %v; want 403", err)
	}

	// A key no principal lists: 401 to the client, its fingerprint in the Edge's log.
	stranger := asOllamaUser(t, base, strangerHome)
	var ae api.AuthorizationError
	if _, err := stranger.List(t.Context()); !errors.As(err, &ae) || ae.StatusCode != http.StatusUnauthorized {
		t.Errorf("list signed with a key nobody lists: %v; want 401", err)
	}
	if err := stranger.Pull(t.Context(), &api.PullRequest{Model: "tiny"}, func(api.ProgressResponse) error { return nil }); !errors.As(err, &ae) {
		t.Errorf("pull signed with a key nobody lists: %v; want 401", err)
	}
	if !waitCond(5*time.Second, func() bool { return strings.Contains(edge.out.String(), `reason="unknown key SHA256:`) }) {
		t.Errorf("the Edge's log does not say which key was refused:\n%s", edge.out)
	}

	// A signature the admin sent, sent again from another address: a replay.
	t.Setenv("HOME", adminHome)
	if _, err := recorded.List(t.Context()); err != nil {
		t.Fatalf("list signed with the admin's key: %v", err)
	}
	again := func(from string) int {
		req, err := http.NewRequest(http.MethodGet, rec.last.URL.String(), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", rec.last.Header.Get("Authorization"))
		resp, err := fromAddr(from).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// At once from the same address it is what the CLI's requests of one second look like.
	if code := again("127.0.0.1"); code != http.StatusOK {
		t.Errorf("the admin's signature sent again at once from the same address: %d; want 200", code)
	}
	if code := again("127.0.0.2"); code != http.StatusUnauthorized {
		t.Errorf("the admin's signature replayed from 127.0.0.2: %d; want 401", code)
	}
	// The log says one refusal of a kind in 10 s; the metric counts each: the stranger's two
	// and the replay.
	if m := metricsText(t, base, ""); !strings.Contains(m, `iop_edge_refusals_total{kind="ollama_signature"} 3`) {
		t.Errorf("iop_edge_refusals_total of ollama_signature is not 3:\n%s", grepLines(m, "iop_edge_refusals_total"))
	}
	for line := range strings.Lines(edge.out.String()) {
		if strings.Contains(line, "Ollama key signature refused") {
			t.Logf("edged: %s", strings.TrimSpace(line))
		}
	}
}
