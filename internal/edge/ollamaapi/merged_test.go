package ollamaapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/iop-dev/iop/internal/edge/sched"
)

func reply(node, body string) dispatch.MetadataReply {
	return dispatch.MetadataReply{NodeID: node, Provider: "ollama", Status: 200, Body: []byte(body)}
}

// TestTagsListTheInventory (P1, issue 11): /api/tags lists exactly the
// models a request can be scheduled for now, in every API the same: an
// Ollama server's entry (kept as it sent it) for a model it serves, under
// the name the client asks for; an entry made from what is known for a
// model another kind of server serves; nothing for what an Ollama server
// lists but no route or candidate offers. A Node that fails the fan-out
// costs its details, not its models.
func TestTagsListTheInventory(t *testing.T) {
	f := &ft.Dispatcher{
		Offerings: []dispatch.Offering{
			ft.Offer("llama3.2:latest", "ollama"),
			ft.Offer("qwen3:8b", "openai"),
			{ID: "fast", Candidates: []sched.Candidate{{NodeID: "n1", Provider: "ollama", Adapter: "ollama", Target: "llama3.2:latest"}}},
			ft.Offer("gemma3:1b", "ollama"),
		},
		Replies: map[string][]dispatch.MetadataReply{"/api/tags": {
			reply("n1", `{"models":[{"name":"llama3.2:latest","size":2,"x_extra":true},{"name":"not-routed:latest","size":9}]}`),
			{NodeID: "n2", Provider: "ollama", Err: errors.New("node lost")},
		}},
	}
	e := newEnv(t, f)
	w := e.do(req(http.MethodGet, "/api/tags", ""))
	if w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var list struct {
		Models []map[string]any `json:"models"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range list.Models {
		names = append(names, m["name"].(string))
	}
	if got := strings.Join(names, ","); got != "fast,gemma3:1b,llama3.2:latest,qwen3:8b" {
		t.Fatalf("listed %s, want the inventory", got)
	}
	byName := func(n string) map[string]any { return list.Models[slices.Index(names, n)] }
	if m := byName("llama3.2:latest"); m["size"] != float64(2) || m["x_extra"] != true {
		t.Errorf("the Ollama server's entry was not kept as sent: %v", m)
	}
	if m := byName("fast"); m["size"] != float64(2) || m["model"] != "fast" {
		t.Errorf("an alias is not listed with its target's entry under its own name: %v", m)
	}
	if m := byName("qwen3:8b"); m["model"] != "qwen3:8b" || m["modified_at"] == nil || m["details"] == nil {
		t.Errorf("a model of another kind of server: %v", m)
	}
	if m := byName("gemma3:1b"); m["model"] != "gemma3:1b" {
		t.Errorf("a model whose server failed the fan-out: %v", m)
	}
	if e.requests(t, routeTags, "ok") != 1 {
		t.Error("not counted ok")
	}
}

// TestPSListsWhatRunsOfTheInventory: an Ollama model is listed once per
// server that has it loaded, and not at all when none has; a model of
// another kind of server is loaded while it is served.
func TestPSListsWhatRunsOfTheInventory(t *testing.T) {
	f := &ft.Dispatcher{
		Offerings: []dispatch.Offering{
			{ID: "qwen3:8b", Candidates: []sched.Candidate{
				{NodeID: "n1", Provider: "ollama", Adapter: "ollama", Target: "qwen3:8b"},
				{NodeID: "n2", Provider: "ollama", Adapter: "ollama", Target: "qwen3:8b"}}},
			ft.Offer("idle:latest", "ollama"),
			ft.Offer("sim-small", "simulator"),
		},
		Replies: map[string][]dispatch.MetadataReply{"/api/ps": {
			reply("n1", `{"models":[{"name":"qwen3:8b","size_vram":1}]}`),
			{NodeID: "n2", Provider: "ollama", Status: 200, Body: []byte(`{"models":[{"name":"qwen3:8b","size_vram":2},{"name":"secret"}]}`)},
		}},
	}
	w := newEnv(t, f).do(req(http.MethodGet, "/api/ps", ""))
	body := w.Body.String()
	if w.Code != 200 || strings.Count(body, `"qwen3:8b"`) != 2 || !strings.Contains(body, `"size_vram":2`) ||
		!strings.Contains(body, `"name":"sim-small"`) || strings.Contains(body, "idle:latest") || strings.Contains(body, "secret") {
		t.Fatalf("status %d: %s", w.Code, body)
	}
}

// TestListingsWithoutNodes: nothing served is an empty list, whatever the
// fan-out says.
func TestListingsWithoutNodes(t *testing.T) {
	for _, path := range []string{"/api/tags", "/api/ps"} {
		e := newEnv(t, &ft.Dispatcher{Offerings: []dispatch.Offering{}, Replies: map[string][]dispatch.MetadataReply{path: {
			reply("n1", `{"models":[{"name":"stale:latest"}]}`)}}})
		if w := e.do(req(http.MethodGet, path, "")); w.Code != 200 || w.Body.String() != `{"models":[]}` {
			t.Errorf("%s without an inventory: %d %s", path, w.Code, w.Body)
		}
	}
}

// TestVersionIsOneNodesOllama: the first Node that answers gives the
// version; none connected is 503; all failing is 502.
func TestVersionIsOneNodesOllama(t *testing.T) {
	tests := []struct {
		name    string
		replies []dispatch.MetadataReply
		status  int
		body    string
	}{
		{"first success", []dispatch.MetadataReply{{NodeID: "n1", Err: errors.New("lost")}, reply("n2", `{"version":"0.17.4"}`),
			reply("n3", `{"version":"0.1.0"}`)}, 200, `{"version":"0.17.4"}`},
		{"none connected", nil, 503, `{"error":"no Ollama provider is connected"}`},
		{"all failing", []dispatch.MetadataReply{{NodeID: "n1", Provider: "ollama", Err: errors.New("lost")}}, 502,
			`{"error":"no Node answered /api/version: node n1 provider ollama: lost"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &ft.Dispatcher{Replies: map[string][]dispatch.MetadataReply{"/api/version": tt.replies}}
			w := newEnv(t, f).do(req(http.MethodGet, "/api/version", ""))
			if w.Code != tt.status || w.Body.String() != tt.body {
				t.Errorf("status %d: %s", w.Code, w.Body)
			}
		})
	}
}

// TestListingsNeedAKey: the merged endpoints authenticate like the others.
func TestListingsNeedAKey(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{})
	for _, path := range []string{"/api/tags", "/api/ps", "/api/version"} {
		r := req(http.MethodGet, path, "")
		r.Header.Set("Authorization", "Bearer wrong")
		if w := e.do(r); w.Code != 401 || errorTextOf(t, w.Body.String()) != "invalid API key" {
			t.Errorf("%s: %d %s", path, w.Code, w.Body)
		}
	}
}
