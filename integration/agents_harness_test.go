package integration

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The harness of the coding agents' tests (agents_test.go): where the
// agents are found, how one is run (bounded, in its own process group,
// with a HOME of its own), the recording door in front of the Edge and the
// trap that stands for the internet.

// agentRunTimeout bounds one run of an agent: a few turns against a fake
// model take a second or two; a hung agent fails the test instead of
// holding CI for its whole timeout.
const agentRunTimeout = 90 * time.Second

// agentBinary returns the path of an agent's command (claude, codex): in
// $IOP_AGENTS_BIN, where .ci/agents.sh installs the pinned versions, else
// on PATH. Without it the test is skipped, or fails under
// IOP_REQUIRE_AGENTS (CI sets it, as IOP_REQUIRE_BROWSER for chromium).
func agentBinary(t *testing.T, name string) string {
	t.Helper()
	if dir := os.Getenv("IOP_AGENTS_BIN"); dir != "" {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p
		}
		if os.Getenv("IOP_REQUIRE_AGENTS") != "" {
			t.Fatalf("%s is not in IOP_AGENTS_BIN=%s, and IOP_REQUIRE_AGENTS is set", name, dir)
		}
		t.Skipf("%s is not in IOP_AGENTS_BIN=%s: run .ci/agents.sh to install the pinned agents", name, dir)
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if os.Getenv("IOP_REQUIRE_AGENTS") != "" {
		t.Fatalf("no %s: IOP_AGENTS_BIN is unset and %s is not on PATH, and IOP_REQUIRE_AGENTS is set", name, name)
	}
	t.Skipf("no %s: install the pinned coding agents with IOP_AGENTS_BIN=$(.ci/agents.sh) (.ci/run does) to run this test", name)
	return ""
}

// agentHome is the private world of one agent's session: its HOME (and
// the XDG directories in it), a working directory, and an environment
// built from nothing, so that no key, setting or history of the person
// running the tests reaches the agent, and none of the agent's reaches
// them.
type agentHome struct {
	home, work string
	env        []string
}

func newAgentHome(t *testing.T, trap *internetTrap) *agentHome {
	t.Helper()
	root := t.TempDir()
	h := &agentHome{home: filepath.Join(root, "home"), work: filepath.Join(root, "work")}
	tmp := filepath.Join(root, "tmp")
	for _, d := range []string{h.home, h.work, tmp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h.env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + h.home,
		"TMPDIR=" + tmp,
		"USER=iop-test",
		"LANG=C.UTF-8",
		"TERM=dumb",
		"NO_COLOR=1",
		"XDG_CONFIG_HOME=" + filepath.Join(h.home, ".config"),
		"XDG_CACHE_HOME=" + filepath.Join(h.home, ".cache"),
		"XDG_DATA_HOME=" + filepath.Join(h.home, ".local", "share"),
		"XDG_STATE_HOME=" + filepath.Join(h.home, ".local", "state"),
		// Anything not on loopback goes to the trap, which refuses it and
		// remembers it: the Edge is the agent's only way out.
		"NO_PROXY=127.0.0.1,localhost,::1", "no_proxy=127.0.0.1,localhost,::1",
	}
	for _, v := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"} {
		h.env = append(h.env, v+"="+trap.url, strings.ToLower(v)+"="+trap.url)
	}
	return h
}

// agentResult is what one run of an agent left.
type agentResult struct {
	stdout, stderr string
	elapsed        time.Duration
}

func (r agentResult) String() string {
	return fmt.Sprintf("after %v\nstdout:\n%s\nstderr:\n%s", r.elapsed.Round(time.Millisecond), r.stdout, r.stderr)
}

// run runs an agent's command in the home's working directory, with its
// environment and extra variables, stdin empty. The agent and everything
// it started (the shell of a tool call) are one process group, killed
// when the run ends or passes agentRunTimeout. It fails the test unless
// the agent exits 0.
func (h *agentHome) run(t *testing.T, extra []string, path string, args ...string) agentResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), agentRunTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = h.work
	cmd.Env = append(append([]string(nil), h.env...), extra...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A grandchild holding the output pipes open must not hold the test.
	cmd.WaitDelay = 5 * time.Second
	began := time.Now()
	err := cmd.Start()
	if err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	err = cmd.Wait()
	// Whatever the agent left running (a background shell) goes with it.
	// The group's id is not reused while one of its processes lives, so
	// this reaches only the agent's own.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	r := agentResult{stdout: stdout.String(), stderr: stderr.String(), elapsed: time.Since(began)}
	switch {
	case ctx.Err() != nil && t.Context().Err() == nil:
		t.Fatalf("%s %s did not finish within %v: %v\n%s", filepath.Base(path), strings.Join(args, " "), agentRunTimeout, err, r)
	case err != nil:
		t.Fatalf("%s %s: %v\n%s", filepath.Base(path), strings.Join(args, " "), err, r)
	}
	t.Logf("%s %s: exit 0 %s", filepath.Base(path), strings.Join(args, " "), r)
	return r
}

// agentVersion is what an agent's --version says, for the test log.
func agentVersion(t *testing.T, h *agentHome, path string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--version")
	cmd.Dir, cmd.Env = h.work, h.env
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s --version: %v", path, err)
	}
	return strings.TrimSpace(string(out))
}

// doorRequest is one request an agent sent through the door, and the
// status the Edge answered.
type doorRequest struct {
	Method, Path, Query string
	// Done says the door has finished with the request; Status is the
	// status the agent got (0: none, it hung up first), and Gone says it
	// had hung up by the time the door was done (Codex hangs up once it has
	// read response.completed, which may be before the stream's end).
	Done   bool
	Status int
	Gone   bool
	Body   []byte // up to doorBodyLimit bytes
	Answer []byte // the start of an error answer's body
	// Dropped is the answer's X-IOP-Dropped-Tools: the hosted tools the
	// Edge left out.
	Dropped string
}

func (r doorRequest) String() string {
	s := fmt.Sprintf("%s %s?%s → %d", r.Method, r.Path, r.Query, r.Status)
	switch {
	case !r.Done:
		s += " (unfinished)"
	case r.Gone:
		s += " (the agent had hung up when the door was done)"
	}
	return s
}

// shape says what a JSON request carried, for the test log: its
// top-level fields, the roles of its messages (Anthropic's messages, the
// Responses API's input items), the types of its tools (the parts of an
// agent's request an Edge may stumble on), and what the Edge dropped.
func (r doorRequest) shape() string {
	var body map[string]json.RawMessage
	if json.Unmarshal(r.Body, &body) != nil {
		return fmt.Sprintf("%s: %d bytes, not a JSON object", r, len(r.Body))
	}
	type part struct{ Type, Role string }
	var parts struct {
		Messages []part `json:"messages"`
		Input    []part `json:"input"` // a string input leaves it empty
		Tools    []part `json:"tools"`
	}
	_ = json.Unmarshal(r.Body, &parts)
	roles, tools := map[string]int{}, map[string]int{}
	for _, m := range append(parts.Messages, parts.Input...) {
		roles[cmp.Or(m.Role, m.Type)]++
	}
	for _, t := range parts.Tools {
		tools[cmp.Or(t.Type, "(untyped)")]++
	}
	return fmt.Sprintf("%s: fields %v, turns by role %v, tools by type %v, dropped %q",
		r, slices.Sorted(maps.Keys(body)), roles, tools, r.Dropped)
}

// doorBodyLimit bounds the part of a request body the door keeps for a
// report.
const doorBodyLimit = 1 << 20

// agentDoor is a reverse proxy in front of the Edge that records every
// request an agent sends and the status it got, with the body of an error
// answer: what the agent saw, whatever the Edge's log and metrics say.
type agentDoor struct {
	url string
	mu  sync.Mutex
	log []doorRequest
}

func newAgentDoor(t *testing.T, edge string) *agentDoor {
	t.Helper()
	target, err := url.Parse(edge)
	if err != nil {
		t.Fatal(err)
	}
	d := &agentDoor{}
	proxy := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target); r.Out.Host = r.In.Host },
		FlushInterval: -1, // server-sent events go through as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the agent hung up first: nobody to answer
			}
			http.Error(w, "agent door: no answer from the Edge: "+err.Error(), http.StatusBadGateway)
		},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		kept := body[:min(len(body), doorBodyLimit)]
		// Entered on arrival, so that a request still being answered when
		// the agent exits (the proxy may finish after the agent read the
		// last event) is waited for, not missed.
		d.mu.Lock()
		i := len(d.log)
		d.log = append(d.log, doorRequest{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: kept})
		d.mu.Unlock()
		rec := &statusRecorder{ResponseWriter: w}
		// Deferred: when the agent hangs up before the answer's end (Codex
		// does, once it has read response.completed), the proxy aborts the
		// handler with a panic (http.ErrAbortHandler).
		defer func() {
			d.mu.Lock()
			defer d.mu.Unlock()
			e := &d.log[i]
			e.Done, e.Status, e.Answer = true, rec.code, rec.answer.Bytes()
			e.Dropped = w.Header().Get("X-IOP-Dropped-Tools")
			e.Gone = r.Context().Err() != nil
		}()
		proxy.ServeHTTP(rec, r)
	}))
	t.Cleanup(srv.Close)
	d.url = srv.URL
	return d
}

// requests returns every request the door has seen, once each has been
// answered.
func (d *agentDoor) requests(t *testing.T) []doorRequest {
	t.Helper()
	var log []doorRequest
	waitFor(t, "the door to finish its requests", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		log = append(log[:0], d.log...)
		return !slices.ContainsFunc(log, func(r doorRequest) bool { return !r.Done })
	})
	return log
}

// report logs every request the door has seen, with the body of those
// the Edge refused or failed: what an agent sent that the Edge would not
// take.
func (d *agentDoor) report(t *testing.T) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	var b strings.Builder
	for _, r := range d.log {
		fmt.Fprintf(&b, "%s\n", r)
		if r.Status >= 400 || !r.Done {
			fmt.Fprintf(&b, "  answer: %s\n  request: %s\n", r.Answer, clip(string(r.Body), 8000))
		}
	}
	t.Logf("what the agent sent through the door:\n%s", b.String())
}

// statusRecorder remembers the status written through it, and the start
// of an error answer's body.
type statusRecorder struct {
	http.ResponseWriter
	code   int
	answer bytes.Buffer
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(p []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	if s.code >= 400 && s.answer.Len() < 4096 {
		s.answer.Write(p[:min(len(p), 4096-s.answer.Len())])
	}
	return s.ResponseWriter.Write(p)
}

// Unwrap lets the proxy flush through the recorder.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// internetTrap stands for everything off loopback: the agents' proxy
// settings point at it, and it refuses and remembers every request (or
// CONNECT) it gets. An agent must need nothing but the Edge.
type internetTrap struct {
	url string
	mu  sync.Mutex
	hit []string
}

func newInternetTrap(t *testing.T) *internetTrap {
	t.Helper()
	tr := &internetTrap{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tr.mu.Lock()
		tr.hit = append(tr.hit, r.Method+" "+r.Host+r.URL.Path)
		tr.mu.Unlock()
		http.Error(w, "iop integration test: no internet for coding agents", http.StatusForbidden)
	}))
	t.Cleanup(srv.Close)
	tr.url = srv.URL
	return tr
}

func (tr *internetTrap) hits() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.hit...)
}

// requestsTotal is iop_edge_requests_total's series in a /metrics text,
// as route → outcome → count.
func requestsTotal(metrics string) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	series := regexp.MustCompile(`^iop_edge_requests_total\{([^}]*)\} (\S+)$`)
	label := regexp.MustCompile(`(\w+)="([^"]*)"`)
	for l := range strings.SplitSeq(metrics, "\n") {
		m := series.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, p := range label.FindAllStringSubmatch(m[1], -1) {
			labels[p[1]] = p[2]
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			continue
		}
		if out[labels["route"]] == nil {
			out[labels["route"]] = map[string]float64{}
		}
		out[labels["route"]][labels["outcome"]] += v
	}
	return out
}
