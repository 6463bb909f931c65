package integration

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// Issue 23: models managed from the Edge. An admin's `ollama pull` (the
// official client's Pull) goes to every Node's Ollama with each Node's
// progress in the stream; a Node that refuses says why in the call's error
// while the other's model is pulled and listed; delete, copy, create and
// the Nodes a request names follow; a key that is not an admin's is
// refused. The Nodes relist every hour here, so the inventory following
// within a second is the management call's own relist (P1).

const (
	manageAdminKey = "sk-manage-admin-0001"
	manageUserKey  = "sk-manage-user-0001"
)

// headers is a transport that sends the given headers with every request.
type headers map[string]string

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// manageClient is the official Ollama client sending h with each request.
func manageClient(t *testing.T, base string, h headers) *api.Client {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	return api.NewClient(u, &http.Client{Transport: h})
}

// startManageStack runs an Edge with an admin and a user key, and two
// Nodes, n1 (gpu: a) on fakes[0] and n2 (gpu: b) on fakes[1], and waits
// until both are ready with their Ollama online.
func startManageStack(t *testing.T, fakes [2]*fakeollama.Server) string {
	t.Helper()
	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	edgeConf := filepath.Join(dir, "edge.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api:
  admin_reads: open
  keys: [{principal: ops, sha256: %s}, {principal: user, sha256: %s}]
principals:
  - {name: ops, routes: ["*"], admin: true}
  - {name: user, routes: ["*"]}
`, quicPort, httpPort, auth.HashKey(manageAdminKey), auth.HashKey(manageUserKey)))
	start(t, "edged", bin.edged, "run", "--config", edgeConf)
	for i, fake := range fakes {
		id := fmt.Sprintf("n%d", i+1)
		conf := filepath.Join(dir, id+".yaml")
		writeFile(t, conf, fmt.Sprintf(`
node_id: %s
labels: {gpu: %c}
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
providers:
  - {name: ollama, adapter: ollama, capacity: 1, relist_interval: 1h, config: {base_url: %q}}
`, id, 'a'+i, quicPort, fake.URL()))
		start(t, "noded-"+id, bin.noded, "run", "--config", conf)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	for _, id := range []string{"n1", "n2"} {
		waitNode(t, base, id, "ready with ollama online", func(n nodeView) bool {
			return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
		})
	}
	return base
}

// waitTags polls the Edge's /api/tags until has(names) holds, and returns
// how long that took; it fails the test after within.
func waitTags(t *testing.T, c *api.Client, what string, within time.Duration, has func([]string) bool) time.Duration {
	t.Helper()
	began := time.Now()
	var names []string
	for time.Since(began) < within {
		names = names[:0]
		if list, err := c.List(t.Context()); err == nil {
			for _, m := range list.Models {
				names = append(names, m.Name)
			}
			if has(names) {
				return time.Since(began)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("after %v, /api/tags lists %q; want %s", within, names, what)
	return 0
}

// pullLog is what a Pull's progress callback saw.
type pullLog struct{ lines []api.ProgressResponse }

func (p *pullLog) fn(r api.ProgressResponse) error {
	p.lines = append(p.lines, r)
	return nil
}

// node is what the lines of node say: their statuses in order (repeats
// dropped) and the digests their progress bars are keyed by.
func (p *pullLog) node(node string) (statuses, digests []string) {
	for _, l := range p.lines {
		s, ok := strings.CutPrefix(l.Status, node+": ")
		if !ok {
			continue
		}
		if len(statuses) == 0 || statuses[len(statuses)-1] != s {
			statuses = append(statuses, s)
		}
		if l.Digest != "" && !slices.Contains(digests, l.Digest) {
			digests = append(digests, l.Digest)
		}
	}
	return statuses, digests
}

func TestPullDeleteAndCopyThroughTheEdgeOnTwoNodes(t *testing.T) {
	var fakes [2]*fakeollama.Server
	for i := range fakes {
		fakes[i] = fakeollama.New(fakeollama.Model{Name: "base:latest", Text: "base answers"})
		defer fakes[i].Close()
		fakes[i].SetPullStep(2 * time.Millisecond)
		fakes[i].SetPullable(fakeollama.Pullable{Model: fakeollama.Model{Name: "tiny", Text: "tiny answers"}, Blobs: []int64{4 << 20, 1 << 10}})
	}
	// Only n1's registry has this one.
	fakes[0].SetPullable(fakeollama.Pullable{Model: fakeollama.Model{Name: "only-a", Text: "from a"}})
	base := startManageStack(t, fakes)
	admin := manageClient(t, base, headers{"Authorization": "Bearer " + manageAdminKey})

	// Onto both Nodes: each Node's progress, its bars its own, one success.
	var pull pullLog
	if err := admin.Pull(t.Context(), &api.PullRequest{Model: "tiny"}, pull.fn); err != nil {
		t.Fatalf("pull onto both Nodes: %v", err)
	}
	for _, n := range []string{"n1", "n2"} {
		statuses, digests := pull.node(n)
		if len(statuses) < 6 || statuses[0] != "pulling manifest" || !slices.Equal(statuses[len(statuses)-3:], []string{"verifying sha256 digest", "writing manifest", "success"}) {
			t.Errorf("%s's progress: %q", n, statuses)
		}
		if len(digests) != 2 || !strings.HasPrefix(digests[0], n+" ") {
			t.Errorf("%s's digests %q: want two, its own", n, digests)
		}
	}
	if last := pull.lines[len(pull.lines)-1]; last.Status != "success" {
		t.Errorf("last line %+v, want the call's success", last)
	}
	took := waitTags(t, admin, "tiny listed", time.Second, func(names []string) bool { return slices.Contains(names, "tiny:latest") })
	t.Logf("a pulled model was listed %v after the pull's last line (relist_interval 1h)", took)
	for i, f := range fakes {
		if !slices.ContainsFunc(f.Models(), func(m fakeollama.Model) bool { return m.Name == "tiny:latest" }) {
			t.Errorf("fake %d does not serve the pulled model", i+1)
		}
	}

	// One Node refuses: its reason is the call's error; the other's model
	// is pulled and listed.
	pull = pullLog{}
	err := admin.Pull(t.Context(), &api.PullRequest{Model: "only-a"}, pull.fn)
	if err == nil || !strings.Contains(err.Error(), "n2: pull model manifest: file does not exist") || !strings.Contains(err.Error(), "succeeded on n1") {
		t.Fatalf("pull refused by n2: %v; want n2's reason and n1's success", err)
	}
	if statuses, digests := pull.node("n1"); len(digests) == 0 || statuses[len(statuses)-1] != "success" {
		t.Errorf("n1's progress beside n2's refusal: %q %q", statuses, digests)
	}
	if statuses, _ := pull.node("n2"); len(statuses) == 0 || !strings.HasPrefix(statuses[len(statuses)-1], "failed: pull model manifest") {
		t.Errorf("n2's lines: %q", statuses)
	}
	waitTags(t, admin, "only-a listed", time.Second, func(names []string) bool { return slices.Contains(names, "only-a:latest") })
	var text string
	if err := admin.Generate(t.Context(), &api.GenerateRequest{Model: "only-a", Prompt: "hi"}, func(r api.GenerateResponse) error {
		text += r.Response
		return nil
	}); err != nil || text != "from a" {
		t.Errorf("generate with the model n1 pulled: %q, %v", text, err)
	}

	// Delete: from every Node that has it; the list follows within a second.
	if err := admin.Delete(t.Context(), &api.DeleteRequest{Model: "tiny"}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	took = waitTags(t, admin, "tiny gone", time.Second, func(names []string) bool { return !slices.Contains(names, "tiny:latest") })
	t.Logf("a deleted model left the list %v after the delete answered", took)
	var se api.StatusError
	if err := admin.Delete(t.Context(), &api.DeleteRequest{Model: "nothing"}); !errors.As(err, &se) || se.StatusCode != http.StatusNotFound || se.ErrorMessage != "model 'nothing' not found" {
		t.Errorf("delete of a model no Node has: %v; want Ollama's 404", err)
	}

	// Copy: on the Node that has the source.
	if err := admin.Copy(t.Context(), &api.CopyRequest{Source: "only-a", Destination: "only-a-copy"}); err != nil {
		t.Fatalf("copy: %v", err)
	}
	waitTags(t, admin, "the copy listed", time.Second, func(names []string) bool { return slices.Contains(names, "only-a-copy:latest") })
	if slices.ContainsFunc(fakes[1].Models(), func(m fakeollama.Model) bool { return strings.HasPrefix(m.Name, "only-a") }) {
		t.Error("n2's server got a model only n1 had")
	}

	// Create: on every Node, from a model each has.
	var created []string
	if err := admin.Create(t.Context(), &api.CreateRequest{Model: "made", From: "base"}, func(p api.ProgressResponse) error {
		created = append(created, p.Status)
		return nil
	}); err != nil || created[len(created)-1] != "success" {
		t.Fatalf("create: %v after %q", err, created)
	}
	waitTags(t, admin, "the created model listed", time.Second, func(names []string) bool { return slices.Contains(names, "made:latest") })
	for i, f := range fakes {
		if !slices.ContainsFunc(f.Models(), func(m fakeollama.Model) bool { return m.Name == "made:latest" }) {
			t.Errorf("fake %d does not serve the created model", i+1)
		}
	}

	// The Nodes a request names: by header (the official client sends no
	// extra fields), here n2 alone.
	named := manageClient(t, base, headers{"Authorization": "Bearer " + manageAdminKey, "X-IOP-Nodes": "n2"})
	pull = pullLog{}
	if err := named.Pull(t.Context(), &api.PullRequest{Model: "tiny"}, pull.fn); err != nil {
		t.Fatalf("pull onto n2: %v", err)
	}
	if s, _ := pull.node("n1"); len(s) != 0 {
		t.Errorf("a pull naming n2 reached n1: %q", s)
	}
	if slices.ContainsFunc(fakes[0].Models(), func(m fakeollama.Model) bool { return m.Name == "tiny:latest" }) {
		t.Error("n1's server has the model pulled onto n2 alone")
	}

	// Not an admin: refused, nothing reaches a Node.
	user := manageClient(t, base, headers{"Authorization": "Bearer " + manageUserKey})
	if err := user.Pull(t.Context(), &api.PullRequest{Model: "tiny"}, func(api.ProgressResponse) error { return nil }); !errors.As(err, &se) || se.StatusCode != http.StatusForbidden {
		t.Errorf("pull with a user's key: %v; want 403", err)
	}
	if err := user.Delete(t.Context(), &api.DeleteRequest{Model: "base"}); !errors.As(err, &se) || se.StatusCode != http.StatusForbidden || !strings.Contains(se.ErrorMessage, "admin") {
		t.Errorf("delete with a user's key: %v; want 403 saying admins only", err)
	}
	anonymous := manageClient(t, base, headers{})
	var ae api.AuthorizationError
	if err := anonymous.Delete(t.Context(), &api.DeleteRequest{Model: "base"}); !errors.As(err, &ae) || ae.StatusCode != http.StatusUnauthorized {
		t.Errorf("delete without a key (the ollama CLI): %v; want 401", err)
	}
	for i, f := range fakes {
		if !slices.ContainsFunc(f.Models(), func(m fakeollama.Model) bool { return m.Name == "base:latest" }) {
			t.Errorf("fake %d lost base to a refused delete", i+1)
		}
	}
}
