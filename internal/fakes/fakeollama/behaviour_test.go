package fakeollama

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

func postChat(ctx context.Context, t *testing.T, s *Server, model string) (*http.Response, error) {
	t.Helper()
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/api/chat", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Test", "yes")
	return http.DefaultClient.Do(req)
}

func TestLinesAreFlushedOneByOne(t *testing.T) {
	const delay = 40 * time.Millisecond
	s := newServer(t, Model{Name: "m", TokenCount: 4, TokenDelay: delay})
	resp, err := postChat(ctxTimeout(t, 5*time.Second), t, s, "m")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Fatalf("content type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	var at []time.Time
	for sc.Scan() {
		at = append(at, time.Now())
	}
	if len(at) != 5 {
		t.Fatalf("%d lines, want 4 tokens and a done line", len(at))
	}
	for i := 1; i < 4; i++ {
		if gap := at[i].Sub(at[i-1]); gap < delay/2 {
			t.Fatalf("line %d arrived %v after the one before: not flushed one by one", i, gap)
		}
	}
}

func TestStallKeepsConnectionOpenUntilClientGoes(t *testing.T) {
	s := newServer(t, Model{Name: "m", TokenCount: 5, Stall: true, StallAfter: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := postChat(ctx, t, s, "m")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for range 2 {
		<-lines
	}
	select {
	case l, ok := <-lines:
		t.Fatalf("stalled stream sent more: %q %v", l, ok)
	case <-time.After(150 * time.Millisecond):
	}
	reqs := s.Requests()
	if reqs[0].Gone() || !reqs[0].End.IsZero() {
		t.Fatalf("request ended while stalled: %+v", reqs[0])
	}
	cancelled := time.Now()
	cancel()
	gone, err := s.WaitForDisconnect(ctxTimeout(t, 2*time.Second), reqs[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := gone.Sub(cancelled); d > 500*time.Millisecond {
		t.Fatalf("disconnect seen %v after the client went", d)
	}
	if r, _ := s.Request(reqs[0].ID); r.Header.Get("X-Test") != "yes" || r.Model != "m" {
		t.Fatalf("recorded %+v", r)
	}
}

func TestCompleteAnswerIsNotADisconnect(t *testing.T) {
	s := newServer(t, Model{Name: "m"})
	resp, err := postChat(ctxTimeout(t, 5*time.Second), t, s, "m")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	reqs, err := s.WaitForRequests(ctxTimeout(t, time.Second), 1)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if r, _ := s.Request(reqs[0].ID); r.Gone() || r.Status != 200 {
		t.Fatalf("request %+v", r)
	}
	var body ChatRequest
	if err := reqs[0].Decode(&body); err != nil || body.Messages[0].Content != "hi" {
		t.Fatalf("decode %+v %v", body, err)
	}
}

func TestPrefillDelaysTheResponseHead(t *testing.T) {
	s := newServer(t, Model{Name: "m", PrefillDelay: 150 * time.Millisecond})
	start := time.Now()
	resp, err := postChat(ctxTimeout(t, 5*time.Second), t, s, "m")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("head after %v, before the prefill ended", d)
	}
}

func TestModes(t *testing.T) {
	s := newServer(t, Model{Name: "m"})
	ctx := ctxTimeout(t, 5*time.Second)

	must(t, s.SetMode(ModeUnavailable))
	resp, err := postChat(ctx, t, s, "m")
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("unavailable: %v %v", resp, err)
	}
	resp.Body.Close()

	must(t, s.SetMode(ModeReset))
	if _, err := postChat(ctx, t, s, "m"); err == nil {
		t.Fatal("reset: request succeeded")
	}

	must(t, s.SetMode(ModeRefuse))
	if _, err := postChat(ctx, t, s, "m"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("refuse: %v", err)
	}

	must(t, s.SetMode(ModeHang))
	hctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := postChat(hctx, t, s, "m"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hang: %v", err)
	}

	must(t, s.SetMode(ModeUp))
	resp, err = postChat(ctx, t, s, "m")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("up again: %v %v", resp, err)
	}
	resp.Body.Close()
}

func TestCloseEndsStalledRequests(t *testing.T) {
	s := New(Model{Name: "m", Stall: true})
	go func() {
		if resp, err := postChat(context.Background(), t, s, "m"); err == nil {
			resp.Body.Close()
		}
	}()
	if _, err := s.WaitForRequests(ctxTimeout(t, 2*time.Second), 1); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Close waited on a stalled request")
	}
}

func TestControlAPI(t *testing.T) {
	s := newServer(t)
	do := func(method, path, body string) int {
		req, _ := http.NewRequest(method, s.URL()+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	m, _ := json.Marshal(Model{Name: "remote", Text: "hello there", TokenDelay: time.Millisecond})
	if c := do("PUT", "/_fake/models", string(m)); c != 204 {
		t.Fatalf("put model: %d", c)
	}
	if got := s.Models(); len(got) != 1 || got[0].TokenDelay != time.Millisecond {
		t.Fatalf("models %+v", got)
	}
	if c := do("PUT", "/_fake/mode", `{"mode":"unavailable"}`); c != 204 || s.Mode() != ModeUnavailable {
		t.Fatalf("mode: %d %v", c, s.Mode())
	}
	if c := do("PUT", "/_fake/mode", `{"mode":"refuse"}`); c != 400 {
		t.Fatalf("refuse remotely: %d", c)
	}
	if c := do("GET", "/_fake/requests", ""); c != 200 {
		t.Fatalf("requests: %d", c)
	}
	if len(s.Requests()) != 0 {
		t.Fatal("control requests were recorded")
	}
	if c := do("DELETE", "/_fake/models/remote", ""); c != 204 || len(s.Models()) != 0 {
		t.Fatalf("delete: %d", c)
	}
}

func TestRequestValidation(t *testing.T) {
	s := newServer(t, Model{Name: "m"})
	cases := []struct {
		path, body string
		status     int
		msg        string
	}{
		{"/api/chat", ``, 400, "missing request body"},
		{"/api/chat", `{"messages":[]}`, 400, "model is required"},
		{"/api/chat", `{`, 400, "unexpected end of JSON input"},
		{"/api/generate", `{"model":"x","prompt":"hi"}`, 404, `model "x" not found, try pulling it first`},
		{"/api/embed", `{"model":"x","input":"hi"}`, 404, "model 'x' not found"},
	}
	for _, tc := range cases {
		resp, err := http.Post(s.URL()+tc.path, "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var eb errorBody
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := json.Unmarshal(b, &eb); err != nil || resp.StatusCode != tc.status || eb.Error != tc.msg {
			t.Errorf("%s %s: %d %s", tc.path, tc.body, resp.StatusCode, b)
		}
	}
	resp, err := http.Get(s.URL() + "/api/nope")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !bytes.Equal(b, []byte("404 page not found")) {
		t.Fatalf("unknown route: %d %q", resp.StatusCode, b)
	}
}

func TestSplitTokensRoundTrips(t *testing.T) {
	for _, s := range []string{"", "a", "a b", " lead", "two  spaces", "end "} {
		if got := strings.Join(splitTokens(s), ""); got != s {
			t.Errorf("%q → %q", s, got)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
