package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/openai/openai-go/v3"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// relistInterval is the Nodes' relist_interval in these tests, and
// inventorySlack what a change may take beyond it to reach the Edge's model
// list: the ProviderStatusUpdate on the control stream, and the polling.
const (
	relistInterval = time.Second
	inventorySlack = 2 * time.Second
)

// startInventoryStack runs an Edge and a Node whose ollama provider
// discovers its targets from fake, relisting every relistInterval. It does
// not wait for the Node.
func startInventoryStack(t *testing.T, fake *fakeollama.Server) *stack {
	t.Helper()
	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	edgeConf, nodeConf := filepath.Join(dir, "edge.yaml"), filepath.Join(dir, "node.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api: {allow_anonymous: true}
`, quicPort, httpPort))
	writeFile(t, nodeConf, fmt.Sprintf(`
node_id: n1
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
providers:
  - {name: ollama, adapter: ollama, capacity: 2, relist_interval: %s, config: {base_url: %q}}
`, quicPort, relistInterval, fake.URL()))
	s := &stack{base: fmt.Sprintf("http://127.0.0.1:%d", httpPort), fake: fake}
	s.edge = start(t, "edged", bin.edged, "run", "--config", edgeConf)
	s.node = start(t, "noded", bin.noded, "run", "--config", nodeConf)
	return s
}

// listedModels is the ids of the Edge's model list (GET /v1/models), or
// nil when the request fails.
func (s *stack) listedModels(t *testing.T) []string {
	t.Helper()
	c := s.openai()
	page, err := c.Models.List(t.Context())
	if err != nil {
		return nil
	}
	ids := []string{}
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	return ids
}

// waitListed polls the model list until whether it lists model is want,
// and returns how long that took; it fails the test after within.
func (s *stack) waitListed(t *testing.T, model string, want bool, within time.Duration) time.Duration {
	t.Helper()
	began := time.Now()
	var ids []string
	for time.Since(began) < within {
		if ids = s.listedModels(t); slices.Contains(ids, model) == want {
			return time.Since(began)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("after %v, /v1/models lists %q; want %s listed: %v", within, ids, model, want)
	return 0
}

// answer sends one chat completion for model and returns its text.
func (s *stack) answer(t *testing.T, model string) (string, error) {
	t.Helper()
	c := s.openai()
	resp, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model:    model,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	if err != nil {
		return "", err
	}
	if len(resp.Choices) == 0 {
		return "", fmt.Errorf("no choices in %s", resp.RawJSON())
	}
	return resp.Choices[0].Message.Content, nil
}

// P1: a model pulled on the Node's model server after the Node started is
// listed by the Edge and answers a chat within one relist interval (plus
// the slack of the update's trip); a model removed from the server leaves
// the list within one interval too.
func TestModelAddedOrRemovedOnTheServerReachesTheEdgeWithinOneInterval(t *testing.T) {
	fake := fakeollama.New(fakeollama.Model{Name: "first:latest", Text: "first answers"})
	defer fake.Close()
	s := startInventoryStack(t, fake)
	waitNode(t, s.base, "n1", "ready with ollama online", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
	})
	s.waitListed(t, "first:latest", true, 5*time.Second)

	fake.SetModel(fakeollama.Model{Name: "late:latest", Text: "pulled after the node started"})
	took := s.waitListed(t, "late:latest", true, relistInterval+inventorySlack)
	t.Logf("an added model was listed after %v (relist_interval %v)", took, relistInterval)
	if text, err := s.answer(t, "late:latest"); err != nil || text != "pulled after the node started" {
		t.Fatalf("chat with the added model: %q, %v", text, err)
	}

	fake.RemoveModel("late:latest")
	took = s.waitListed(t, "late:latest", false, relistInterval+inventorySlack)
	t.Logf("a removed model left the list after %v", took)
	if ids := s.listedModels(t); !slices.Contains(ids, "first:latest") {
		t.Errorf("/v1/models %q lost the model that stayed", ids)
	}
	if text, err := s.answer(t, "first:latest"); err != nil || text != "first answers" {
		t.Errorf("chat with the model that stayed: %q, %v", text, err)
	}
	// Every list and the routing agree: the removed model is in no list
	// and is 404 in both APIs, as a model nobody ever had.
	var apiErr *openai.Error
	if _, err := s.answer(t, "late:latest"); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("OpenAI chat with the removed model: %v, want 404", err)
	}
	oc := ollamaClient(t, s.base)
	if list, err := oc.List(t.Context()); err != nil || len(list.Models) != 1 || list.Models[0].Name != "first:latest" {
		t.Errorf("/api/tags after the removal: %+v, %v", list, err)
	}
	err := oc.Chat(t.Context(), &api.ChatRequest{Model: "late:latest", Messages: []api.Message{{Role: "user", Content: "hi"}}},
		func(api.ChatResponse) error { return nil })
	var se api.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusNotFound {
		t.Errorf("Ollama chat with the removed model: %v, want 404", err)
	}
}

// P1, R1: a Node started while its model server is not listening registers
// and becomes ready with the provider offline (not a failed plugin), and
// the provider comes online with its models once the server starts, within
// one relist interval.
func TestNodeStartedBeforeItsModelServerComesOnlineWhenTheServerStarts(t *testing.T) {
	fake := fakeollama.New(fakeollama.Model{Name: "m:latest", Text: "the server is up"})
	defer fake.Close()
	if err := fake.SetMode(fakeollama.ModeRefuse); err != nil {
		t.Fatal(err)
	}
	s := startInventoryStack(t, fake)
	waitNode(t, s.base, "n1", "ready with ollama offline", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "offline"
	})
	if detail := providerDetail(t, s.base); !strings.Contains(detail, "model server not answering") {
		t.Errorf("offline provider's detail %q, want it to say the model server is not answering", detail)
	}
	time.Sleep(3 * relistInterval) // several listings fail meanwhile
	if ids := s.listedModels(t); len(ids) != 0 {
		t.Errorf("/v1/models lists %q while the model server is down", ids)
	}

	if err := fake.SetMode(fakeollama.ModeUp); err != nil {
		t.Fatal(err)
	}
	took := s.waitListed(t, "m:latest", true, relistInterval+inventorySlack)
	t.Logf("the provider came online %v after its model server started", took)
	waitNode(t, s.base, "n1", "ollama online", func(n nodeView) bool { return n.Providers[0].State == "online" })
	if text, err := s.answer(t, "m:latest"); err != nil || text != "the server is up" {
		t.Fatalf("chat once the server is up: %q, %v", text, err)
	}
	if out := s.node.out.String(); strings.Contains(out, "adapter plugin failed to start") || strings.Contains(out, "circuit open") {
		t.Errorf("a model server that was down failed the plugin:\n%s", out)
	}
}

// providerDetail is the detail /admin/v1/nodes shows for n1's provider.
func providerDetail(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/admin/v1/nodes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Nodes []struct {
			Providers []struct {
				Detail string `json:"detail"`
			} `json:"providers"`
		} `json:"nodes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || len(body.Nodes) != 1 || len(body.Nodes[0].Providers) != 1 {
		t.Fatalf("/admin/v1/nodes: %v %+v", err, body)
	}
	return body.Nodes[0].Providers[0].Detail
}
