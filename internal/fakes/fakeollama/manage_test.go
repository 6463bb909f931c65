package fakeollama

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"
)

// tagNames is what /api/tags lists, through the official client.
func tagNames(t *testing.T, c *api.Client) []string {
	t.Helper()
	list, err := c.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range list.Models {
		names = append(names, m.Name)
	}
	return names
}

// A pull through the official client: Ollama's progress lines in Ollama's
// order, each blob from no bytes to all of them, then the model is served
// and listed. A second pull finds the blobs held (one whole line each).
func TestPullStreamsOllamasProgressThenServesTheModel(t *testing.T) {
	s := newServer(t)
	s.SetPullable(Pullable{Model: Model{Name: "tiny", Text: "pulled"}, Blobs: []int64{1000, 10}})
	c := client(t, s)
	var lines []api.ProgressResponse
	if err := c.Pull(t.Context(), &api.PullRequest{Model: "tiny"}, func(p api.ProgressResponse) error {
		lines = append(lines, p)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var statuses []string
	for _, l := range lines {
		if len(statuses) == 0 || statuses[len(statuses)-1] != l.Status {
			statuses = append(statuses, l.Status)
		}
	}
	d0, d1 := blobDigest("tiny", 0), blobDigest("tiny", 1)
	want := []string{"pulling manifest", "pulling " + d0[7:19], "pulling " + d1[7:19], "verifying sha256 digest", "writing manifest", "success"}
	if !slices.Equal(statuses, want) {
		t.Fatalf("statuses %q, want %q", statuses, want)
	}
	if n := len(lines); n != 1+2*(1+PullSteps)+3 {
		t.Errorf("%d lines, want %d", n, 1+2*(1+PullSteps)+3)
	}
	if l := lines[1+PullSteps]; l.Digest != d0 || l.Total != 1000 || l.Completed != 1000 {
		t.Errorf("last line of the first blob: %+v", l)
	}
	if names := tagNames(t, c); !slices.Equal(names, []string{"tiny:latest"}) {
		t.Fatalf("/api/tags after the pull: %q", names)
	}
	var got string
	if err := c.Generate(t.Context(), &api.GenerateRequest{Model: "tiny", Prompt: "hi"}, func(r api.GenerateResponse) error {
		got += r.Response
		return nil
	}); err != nil || got != "pulled" {
		t.Fatalf("generate with the pulled model: %q, %v", got, err)
	}

	lines = nil
	if err := c.Pull(t.Context(), &api.PullRequest{Model: "tiny:latest"}, func(p api.ProgressResponse) error {
		lines = append(lines, p)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(lines) != 1+2+3 || lines[1].Completed != lines[1].Total {
		t.Errorf("pulled again: %+v, want one whole line per blob", lines)
	}
}

// A pull the registry cannot serve fails as Ollama's does, after "pulling
// manifest": the official client returns the error line's message.
func TestPullRefusals(t *testing.T) {
	s := newServer(t)
	s.SetPullable(Pullable{Model: Model{Name: "gated"}, Refuse: "pull model manifest: 401: unauthorized"})
	c := client(t, s)
	for _, tc := range []struct{ model, want string }{
		{"nowhere", "pull model manifest: file does not exist"},
		{"gated", "pull model manifest: 401: unauthorized"},
	} {
		var statuses []string
		err := c.Pull(t.Context(), &api.PullRequest{Model: tc.model}, func(p api.ProgressResponse) error {
			statuses = append(statuses, p.Status)
			return nil
		})
		if err == nil || err.Error() != tc.want || !slices.Equal(statuses, []string{"pulling manifest"}) {
			t.Errorf("pull %s: %v after %q, want %q after pulling manifest", tc.model, err, statuses, tc.want)
		}
	}
	s.SetPullable(Pullable{Model: Model{Name: "fine"}})
	s.RefusePulls("dial tcp: lookup registry.ollama.ai: no such host")
	if err := c.Pull(t.Context(), &api.PullRequest{Model: "fine"}, func(api.ProgressResponse) error { return nil }); err == nil || !strings.Contains(err.Error(), "no such host") {
		t.Errorf("pull from a server refusing pulls: %v", err)
	}
	s.RefusePulls("")
	stream := false
	if err := c.Pull(t.Context(), &api.PullRequest{Model: "fine", Stream: &stream}, func(p api.ProgressResponse) error {
		if p.Status != "success" {
			t.Errorf("stream false answered %+v", p)
		}
		return nil
	}); err != nil {
		t.Errorf("pull once pulls are served again: %v", err)
	}
	if names := tagNames(t, c); !slices.Equal(names, []string{"fine:latest"}) {
		t.Errorf("/api/tags: %q", names)
	}
}

// Delete, copy and create answer with Ollama's statuses and bodies.
func TestDeleteCopyCreate(t *testing.T) {
	s := newServer(t, Model{Name: "base:latest", Text: "base answers"})
	c := client(t, s)
	var se api.StatusError
	if err := c.Delete(t.Context(), &api.DeleteRequest{Model: "absent"}); !errors.As(err, &se) || se.StatusCode != http.StatusNotFound || se.ErrorMessage != "model 'absent' not found" {
		t.Errorf("delete of an absent model: %v", err)
	}
	if err := c.Copy(t.Context(), &api.CopyRequest{Source: "absent", Destination: "x"}); !errors.As(err, &se) || se.StatusCode != http.StatusNotFound || se.ErrorMessage != `model "absent" not found` {
		t.Errorf("copy of an absent model: %v", err)
	}
	if err := c.Copy(t.Context(), &api.CopyRequest{Source: "base", Destination: "copy"}); err != nil {
		t.Fatal(err)
	}
	var statuses []string
	if err := c.Create(t.Context(), &api.CreateRequest{Model: "made", From: "base"}, func(p api.ProgressResponse) error {
		statuses = append(statuses, p.Status)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(statuses) < 3 || !strings.HasPrefix(statuses[0], "using existing layer sha256:") || !slices.Equal(statuses[len(statuses)-2:], []string{"writing manifest", "success"}) {
		t.Errorf("create statuses %q", statuses)
	}
	if err := c.Create(t.Context(), &api.CreateRequest{Model: "x"}, func(api.ProgressResponse) error { return nil }); !errors.As(err, &se) || se.StatusCode != http.StatusBadRequest {
		t.Errorf("create without from: %v", err)
	}
	if names := tagNames(t, c); !slices.Equal(names, []string{"base:latest", "copy:latest", "made:latest"}) {
		t.Fatalf("/api/tags: %q", names)
	}
	resp, err := http.NewRequestWithContext(t.Context(), http.MethodDelete, s.URL()+"/api/delete", strings.NewReader(`{"model":"copy"}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := http.DefaultClient.Do(resp)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != http.StatusOK || len(b) != 0 {
		t.Errorf("delete: %d %q, want 200 with no body", r.StatusCode, b)
	}
	if names := tagNames(t, c); !slices.Equal(names, []string{"base:latest", "made:latest"}) {
		t.Errorf("/api/tags after the delete: %q", names)
	}
}
