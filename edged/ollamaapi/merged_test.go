package ollamaapi

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/iop-dev/iop/edged/gateway"
)

func reply(node, body string) gateway.MetadataReply {
	return gateway.MetadataReply{NodeID: node, Provider: "ollama", Status: 200, Body: []byte(body)}
}

// TestTagsMergeAcrossNodes (issue 4): /api/tags is every ready Node's
// models, the first Node's entry winning for a name two have, entries kept
// as the Node sent them, without the models the principal may not use,
// sorted by name. A Node that fails is left out.
func TestTagsMergeAcrossNodes(t *testing.T) {
	f := &fakeRunner{forbidden: []string{"secret:latest"}, replies: map[string][]gateway.MetadataReply{"/api/tags": {
		reply("n1", `{"models":[{"name":"qwen3:8b","size":1,"x_extra":true},{"name":"llama3.2:latest","size":2}]}`),
		{NodeID: "n2", Provider: "ollama", Err: errors.New("node lost")},
		reply("n3", `{"models":[{"name":"llama3.2:latest","size":3},{"name":"secret:latest"},{"model":"gemma3:1b"}]}`),
		{NodeID: "n4", Provider: "ollama", Status: 500, Body: []byte(`{"error":"boom"}`)},
		reply("n5", `not json`),
	}}}
	e := newEnv(t, f)
	w := e.do(req(http.MethodGet, "/api/tags", ""))
	want := `{"models":[{"model":"gemma3:1b"},{"name":"llama3.2:latest","size":2},{"name":"qwen3:8b","size":1,"x_extra":true}]}`
	if w.Code != 200 || w.Body.String() != want {
		t.Fatalf("status %d\n got %s\nwant %s", w.Code, w.Body, want)
	}
	if got := strings.Join(f.meta, ";"); got != "GET /api/tags 8388608" {
		t.Errorf("metadata calls %q", got)
	}
	if e.requests(t, routeTags, "ok") != 1 {
		t.Error("not counted ok")
	}
}

// TestPSMergeKeepsEveryProcess: a model running on two Nodes is two
// processes, both listed.
func TestPSMergeKeepsEveryProcess(t *testing.T) {
	f := &fakeRunner{forbidden: []string{"secret"}, replies: map[string][]gateway.MetadataReply{"/api/ps": {
		reply("n1", `{"models":[{"name":"qwen3:8b","size_vram":1}]}`),
		reply("n2", `{"models":[{"name":"qwen3:8b","size_vram":2},{"name":"secret"},{"name":"a:1"}]}`),
	}}}
	w := newEnv(t, f).do(req(http.MethodGet, "/api/ps", ""))
	want := `{"models":[{"name":"a:1"},{"name":"qwen3:8b","size_vram":1},{"name":"qwen3:8b","size_vram":2}]}`
	if w.Code != 200 || w.Body.String() != want {
		t.Fatalf("status %d\n got %s\nwant %s", w.Code, w.Body, want)
	}
}

// TestListingsWhenNodesFail: no Node at all is an empty list; every Node
// failing is 502, since an empty list would say that no model exists.
func TestListingsWhenNodesFail(t *testing.T) {
	for _, path := range []string{"/api/tags", "/api/ps"} {
		e := newEnv(t, &fakeRunner{})
		if w := e.do(req(http.MethodGet, path, "")); w.Code != 200 || w.Body.String() != `{"models":[]}` {
			t.Errorf("%s without Nodes: %d %s", path, w.Code, w.Body)
		}
		e = newEnv(t, &fakeRunner{replies: map[string][]gateway.MetadataReply{path: {
			{NodeID: "n1", Provider: "ollama", Err: errors.New("node lost")},
			{NodeID: "n2", Provider: "ollama", Status: 503, Body: []byte(`{"error":"down"}`)},
		}}})
		w := e.do(req(http.MethodGet, path, ""))
		if w.Code != 502 {
			t.Fatalf("%s with every Node failing: %d %s", path, w.Code, w.Body)
		}
		if msg := errorOf(t, w.Body.String()); !strings.Contains(msg, "node n1 provider ollama: node lost") ||
			!strings.Contains(msg, `node n2 provider ollama: status 503: {"error":"down"}`) {
			t.Errorf("error %q", msg)
		}
	}
}

// TestVersionIsOneNodesOllama: the first Node that answers gives the
// version; none connected is 503; all failing is 502.
func TestVersionIsOneNodesOllama(t *testing.T) {
	tests := []struct {
		name    string
		replies []gateway.MetadataReply
		status  int
		body    string
	}{
		{"first success", []gateway.MetadataReply{{NodeID: "n1", Err: errors.New("lost")}, reply("n2", `{"version":"0.17.4"}`),
			reply("n3", `{"version":"0.1.0"}`)}, 200, `{"version":"0.17.4"}`},
		{"none connected", nil, 503, `{"error":"no Ollama provider is connected"}`},
		{"all failing", []gateway.MetadataReply{{NodeID: "n1", Provider: "ollama", Err: errors.New("lost")}}, 502,
			`{"error":"no Node answered /api/version: node n1 provider ollama: lost"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeRunner{replies: map[string][]gateway.MetadataReply{"/api/version": tt.replies}}
			w := newEnv(t, f).do(req(http.MethodGet, "/api/version", ""))
			if w.Code != tt.status || w.Body.String() != tt.body {
				t.Errorf("status %d: %s", w.Code, w.Body)
			}
		})
	}
}

// TestListingsNeedAKey: the merged endpoints authenticate like the others.
func TestListingsNeedAKey(t *testing.T) {
	e := newEnv(t, &fakeRunner{})
	for _, path := range []string{"/api/tags", "/api/ps", "/api/version"} {
		r := req(http.MethodGet, path, "")
		r.Header.Set("Authorization", "Bearer wrong")
		if w := e.do(r); w.Code != 401 || errorOf(t, w.Body.String()) != "invalid API key" {
			t.Errorf("%s: %d %s", path, w.Code, w.Body)
		}
	}
}
