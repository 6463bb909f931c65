package ollamaapi

import (
	"net/http"
	"strings"
	"testing"

	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// TestRenamerGivesTheClientsNameBack (P2, issue 10 item 8): lines that
// start with {"model":"<target>" get the client's name, wherever the reads
// cut them; other lines pass byte for byte.
func TestRenamerGivesTheClientsNameBack(t *testing.T) {
	const (
		in = `{"model":"llama3.2:latest","message":{"content":"a"},"done":false}` + "\n" +
			`{"model":"llama3.2:latest-x","done":false}` + "\n" +
			`{"error":"model \"llama3.2:latest\" not found"}` + "\n" +
			`{"model":"llama3.2","done":false}` + "\n" +
			` {"model":"llama3.2:latest"}` + "\n" +
			`{"model":"llama3.2:latest","done":true}` + "\n" +
			`{"model":"ll`
		want = `{"model":"fast","message":{"content":"a"},"done":false}` + "\n" +
			`{"model":"llama3.2:latest-x","done":false}` + "\n" +
			`{"error":"model \"llama3.2:latest\" not found"}` + "\n" +
			`{"model":"llama3.2","done":false}` + "\n" +
			` {"model":"llama3.2:latest"}` + "\n" +
			`{"model":"fast","done":true}` + "\n" +
			`{"model":"ll`
	)
	for _, size := range []int{1, 2, 3, 7, 26, 27, 64, len(in)} {
		r := newRenamer("llama3.2:latest", "fast")
		var out strings.Builder
		for p := in; len(p) > 0; {
			n := min(size, len(p))
			out.Write(r.rename([]byte(p[:n])))
			p = p[n:]
		}
		out.Write(r.flush())
		if out.String() != want {
			t.Errorf("reads of %d bytes:\n got %q\nwant %q", size, out.String(), want)
		}
	}
}

// TestWithModelKeepsEveryOtherMember (P2): the rewrite changes the name
// only, in "model" (or in show's deprecated "name" when that is what the
// client used), and keeps every other member, unknown ones included, with
// the client's text as written.
func TestWithModelKeepsEveryOtherMember(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"model", `{"model":"fast","messages":[{"role":"user","content":"a<b> & c"}],"x_unknown":{"k":[1, 2]},"stream":true}`,
			`{"messages":[{"role":"user","content":"a<b> & c"}],"model":"llama3.2:latest","stream":true,"x_unknown":{"k":[1,2]}}`},
		{"show by name", `{"name":"fast","verbose":true}`, `{"name":"llama3.2:latest","verbose":true}`},
		{"show with an empty model", `{"model":"","name":"fast"}`, `{"model":"","name":"llama3.2:latest"}`},
		{"show with both", `{"model":"fast","name":"other"}`, `{"model":"llama3.2:latest","name":"other"}`},
	}
	for _, tt := range tests {
		got, err := withModel([]byte(tt.body), "llama3.2:latest")
		if err != nil || string(got) != tt.want {
			t.Errorf("%s: %s, %v\nwant %s", tt.name, got, err, tt.want)
		}
	}
}

// TestAliasRouteSendsEachCandidateItsTarget (P2, issue 10 item 8): each
// candidate tried gets the body with its own target's name, and the answer
// of the one that served comes back with the client's name; a line naming
// another model, or not starting with the model, passes as it is.
func TestAliasRouteSendsEachCandidateItsTarget(t *testing.T) {
	f := &ft.Dispatcher{Targets: []string{"llama3.2:latest", "qwen3:8b"}, Pieces: []ft.Step{
		ft.Line(`{"model":"qwen3:8b","message":{"content":"a"},"done":false}`),
		ft.Line(`{"model":"llama3.2:latest","done":false}`),
		ft.Line(`{"done":false,"model":"qwen3:8b"}`),
		ft.Line(`{"model":"qwen3:8b","done":true}`),
	}}
	e := newEnv(t, f)
	w := e.do(req(http.MethodPost, "/api/chat", `{"model":"fast","messages":[{"role":"user","content":"hi"}],"options":{"x":1}}`))
	want := `{"model":"fast","message":{"content":"a"},"done":false}` + "\n" +
		`{"model":"llama3.2:latest","done":false}` + "\n" +
		`{"done":false,"model":"qwen3:8b"}` + "\n" +
		`{"model":"fast","done":true}` + "\n"
	if w.Code != 200 || w.Body.String() != want {
		t.Fatalf("status %d:\n%s\nwant\n%s", w.Code, w.Body, want)
	}
	s := f.Start(t)
	wantBodies := []string{
		`{"messages":[{"role":"user","content":"hi"}],"model":"llama3.2:latest","options":{"x":1}}`,
		`{"messages":[{"role":"user","content":"hi"}],"model":"qwen3:8b","options":{"x":1}}`,
	}
	if s.Model != "fast" || strings.Join(s.Bodies, "\n") != strings.Join(wantBodies, "\n") {
		t.Errorf("routed by %q, bodies:\n%s", s.Model, strings.Join(s.Bodies, "\n"))
	}
	if e.requests(t, routeChat, "ok") != 1 {
		t.Error("not counted ok")
	}
}

// TestSameModelIsNotRewritten: a target that is the client's name, or its
// ":latest" twin, is the same model to Ollama: the body goes byte for byte
// and the answer comes back untouched, as for a candidate that served
// after another that needed the rewrite.
func TestSameModelIsNotRewritten(t *testing.T) {
	tests := []struct {
		name    string
		model   string
		targets []string
	}{
		{"implicit latest", "llama3.2", []string{"llama3.2:latest"}},
		{"explicit latest", "llama3.2:latest", []string{"llama3.2"}},
		{"same name", "qwen3:8b", []string{"qwen3:8b"}},
		{"after an alias candidate", "llama3.2", []string{"other:7b", "llama3.2:latest"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			answer := `{"model":"` + tt.targets[len(tt.targets)-1] + `","done":true}` + "\n"
			f := &ft.Dispatcher{Targets: tt.targets, Pieces: []ft.Step{ft.Line(strings.TrimSuffix(answer, "\n"))}}
			e := newEnv(t, f)
			body := `{ "model": "` + tt.model + `", "prompt": "hi" }`
			if w := e.do(req(http.MethodPost, "/api/generate", body)); w.Code != 200 || w.Body.String() != answer {
				t.Fatalf("status %d: %q, want %q", w.Code, w.Body, answer)
			}
			if s := f.Start(t); string(s.Body) != body {
				t.Errorf("sent %s, want %s", s.Body, body)
			}
		})
	}
}

// TestAliasedShowAndEmbed: show names the target where the client put the
// name, "name" included; a single JSON answer (embed) gets the client's
// name back too.
func TestAliasedShowAndEmbed(t *testing.T) {
	jsonHead := &wirepb.TunnelResponseHead{Status: 200, Headers: []*wirepb.Header{{Name: "Content-Type", Value: "application/json; charset=utf-8"}}}
	f := &ft.Dispatcher{Head: jsonHead, Targets: []string{"llama3.2:latest"}, Pieces: []ft.Step{{Data: `{"modelfile":"FROM llama3.2:latest"}`}}}
	e := newEnv(t, f)
	if w := e.do(req(http.MethodPost, "/api/show", `{"name":"fast"}`)); w.Code != 200 || w.Body.String() != `{"modelfile":"FROM llama3.2:latest"}` {
		t.Fatalf("show: %d %s", w.Code, w.Body)
	}
	if s := f.Start(t); s.Model != "fast" || string(s.Body) != `{"name":"llama3.2:latest"}` {
		t.Errorf("show routed by %q, sent %s", s.Model, s.Body)
	}

	f = &ft.Dispatcher{Head: jsonHead, Targets: []string{"nomic-embed-text:latest"},
		Pieces: []ft.Step{{Data: `{"model":"nomic-embed-text:latest","embeddings":[[0.1,0.2]]}`}}}
	e = newEnv(t, f)
	w := e.do(req(http.MethodPost, "/api/embed", `{"model":"embedder","input":"a"}`))
	if w.Code != 200 || w.Body.String() != `{"model":"embedder","embeddings":[[0.1,0.2]]}` {
		t.Fatalf("embed: %d %s", w.Code, w.Body)
	}
	if s := f.Start(t); string(s.Body) != `{"input":"a","model":"nomic-embed-text:latest"}` {
		t.Errorf("embed sent %s", s.Body)
	}
}
