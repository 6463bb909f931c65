package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/iop-dev/iop/internal/edge/adminapi"
	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	fleet1 "github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/inflight"
	"github.com/iop-dev/iop/internal/edge/statuspage"
	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/quicwire"
)

// The status page (issue 15) in a real headless Chromium against real
// edged and noded processes, with the fake Ollama behind the Node.
//
// The browser is Debian's chromium (or chromium-browser, google-chrome,
// or $IOP_CHROMIUM); .ci/run installs it and sets IOP_REQUIRE_BROWSER, so
// that CI fails rather than skips without one. Screenshots go to
// $IOP_SCREENSHOTS (CI keeps them) or the test's temporary directory;
// IOP_STATUS_PAGE_PNG names a file to copy the one under load to (the
// README's docs/status-page.png is made so).

// statusLiveness divides the Edge's liveness profile, so that a Node killed
// outright is fenced within seconds, not a minute (R8 scaled).
const statusLiveness = 6

// Models of the fake: "think" holds a long silent prefill, then streams;
// "chat" streams from the start, slowly, to keep the page busy; "quick"
// answers at once; "broken" fails, as a model server out of memory does.
var (
	thinkModel  = fakeollama.Model{Name: "think:latest", PrefillDelay: 3 * time.Second, TokenCount: 20, TokenDelay: 100 * time.Millisecond}
	chatModel   = fakeollama.Model{Name: "chat:latest", TokenCount: 60, TokenDelay: 100 * time.Millisecond}
	quickModel  = fakeollama.Model{Name: "quick:latest", TokenCount: 5}
	brokenModel = fakeollama.Model{Name: "broken:latest", FailStatus: 500, FailMessage: "model requires more system memory than is available"}
)

// requireBrowser returns the path of a Chromium, or skips the test (fails
// it under IOP_REQUIRE_BROWSER) when there is none.
func requireBrowser(t *testing.T) string {
	t.Helper()
	browser := findBrowser()
	if browser == "" {
		if os.Getenv("IOP_REQUIRE_BROWSER") != "" {
			t.Fatal("no chromium found (chromium, chromium-browser, google-chrome or $IOP_CHROMIUM), and IOP_REQUIRE_BROWSER is set")
		}
		t.Skip("no chromium found (chromium, chromium-browser, google-chrome or $IOP_CHROMIUM): install Debian's chromium to run the status page's browser tests (.ci/run does)")
	}
	return browser
}

// findBrowser returns the path of a Chromium, or "" when there is none.
func findBrowser() string {
	if p := os.Getenv("IOP_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// pageView is what the page shows, read from its DOM.
type pageView struct {
	Loaded bool `json:"loaded"`
	Conn   string
	// Locked: the page shows the key form (and not the status), saying Why.
	Locked bool
	Why    string
	Nodes  []struct {
		ID, State, Text string
		Providers       []struct{ Name, State, Text string }
	}
	Live []struct {
		ID, Kind, Phase, Model, Node, Badge string
		Tokens                              int
	}
	Recent    []struct{ ID, Reason string }
	Terminals map[string]int
	// Tiles are the tiles' figures by tile.
	Tiles map[string]string
}

const readPage = `(() => {
  const rows = (sel) => [...document.querySelectorAll(sel)];
  return {
    loaded: document.body.dataset.loaded === 'true',
    Conn: document.getElementById('conn').dataset.state,
    Locked: !document.getElementById('keyform').hidden && document.getElementById('main').hidden,
    Why: document.getElementById('keywhy').innerText,
    Nodes: rows('#nodes tbody tr[data-node]').map((tr) => ({
      ID: tr.dataset.node, State: tr.dataset.state, Text: tr.innerText,
      Providers: [...tr.querySelectorAll('.provider')].map((p) => ({Name: p.dataset.provider, State: p.dataset.state, Text: p.innerText})),
    })),
    Live: rows('#live tbody tr[data-id]').map((tr) => ({
      ID: tr.dataset.id, Kind: tr.dataset.kind, Phase: tr.dataset.phase, Model: tr.dataset.model, Node: tr.dataset.node,
      Badge: tr.querySelector('.badge').className, Tokens: Number(tr.cells[8].innerText),
    })),
    Recent: rows('#recent tbody tr[data-id]').map((tr) => ({ID: tr.dataset.id, Reason: tr.dataset.reason})),
    Terminals: Object.fromEntries(rows('#terminals tbody tr[data-reason]').map((tr) => [tr.dataset.reason, Number(tr.dataset.total)])),
    Tiles: Object.fromEntries(rows('#tiles .tile').map((t) => [t.dataset.tile, t.querySelector('.n').innerText])),
  };
})()`

// browserPage is the status page open in a headless Chromium.
type browserPage struct {
	t    *testing.T
	ctx  context.Context
	base string
	dir  string // where screenshots go

	mu       sync.Mutex
	requests []string // every URL the page requested
	errors   []string // exceptions and console errors
}

// openStatusPage opens base's status page and waits for its first poll.
func openStatusPage(t *testing.T, browser, base string) *browserPage {
	t.Helper()
	p := newBrowserPage(t, browser, base)
	p.open()
	p.wait("the page's first poll", 15*time.Second, func(v pageView) bool { return v.Loaded })
	return p
}

// newBrowserPage starts a headless Chromium for base's status page.
func newBrowserPage(t *testing.T, browser, base string) *browserPage {
	t.Helper()
	dir := os.Getenv("IOP_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	profile := t.TempDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.UserDataDir(profile), chromedp.DisableGPU,
		chromedp.NoSandbox, // a test browser that loads only the Edge on loopback, often as root in CI
		chromedp.WindowSize(1400, 1050),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	p := &browserPage{t: t, ctx: ctx, base: base, dir: dir}
	if err := chromedp.Listen(ctx, func(ev any) {
		p.mu.Lock()
		defer p.mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			p.requests = append(p.requests, ev.Request.URL)
		case *runtime.EventExceptionThrown:
			p.errors = append(p.errors, (&chromedp.ExceptionError{ExceptionDetails: ev.ExceptionDetails}).Error())
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning {
				p.errors = append(p.errors, fmt.Sprintf("console.%s %v", ev.Type, ev.Args))
			}
		}
	}); err != nil {
		t.Fatalf("start chromium (%s): %v", browser, err)
	}
	return p
}

// open navigates to the status page, polling fast, so that a 3 s prefill
// is seen many times over.
func (p *browserPage) open() {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.Navigate(p.base+"/status?interval=200")); err != nil {
		p.t.Fatalf("open the status page: %v", err)
	}
}

// read returns what the page shows now.
func (p *browserPage) read() pageView {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[pageView](readPage))
	if err != nil {
		p.t.Fatalf("read the page: %v", err)
	}
	return v
}

// wait polls the page until cond holds, and fails after within.
func (p *browserPage) wait(what string, within time.Duration, cond func(pageView) bool) pageView {
	p.t.Helper()
	v, ok := p.poll(within, cond)
	if !ok {
		p.shot("timeout")
		p.t.Fatalf("the page did not show %s within %v; it shows %+v", what, within, v)
	}
	return v
}

// poll polls the page until cond holds or within passed, and returns what
// it showed last and whether cond held.
func (p *browserPage) poll(within time.Duration, cond func(pageView) bool) (pageView, bool) {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for {
		v := p.read()
		if cond(v) {
			return v, true
		}
		if time.Now().After(deadline) {
			return v, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// shot saves a screenshot of the page as name.png and returns its path.
func (p *browserPage) shot(name string) string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	b, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Errorf("screenshot %s: %v", name, err)
		return ""
	}
	path := filepath.Join(p.dir, "status-page-"+name+".png")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("screenshot: %s", path)
	return path
}

// statusStack is edged (with a scaled liveness profile) and noded on
// loopback, with one Ollama provider of capacity 4 on the fake.
func statusStack(t *testing.T) (base string, node *proc) {
	t.Helper()
	fake := fakeollama.New(thinkModel, chatModel, quickModel, brokenModel)
	t.Cleanup(fake.Close)
	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	edgeConf, nodeConf := filepath.Join(dir, "edge.yaml"), filepath.Join(dir, "node.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
edge_id: edge-1
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
profiles:
  - {name: default, deadline: 2m, queue_timeout: 10s, max_queue_depth: 16, idle_timeout: 30s}
`, quicPort, httpPort))
	writeFile(t, nodeConf, fmt.Sprintf(`
node_id: n1
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
providers:
  - {name: ollama, adapter: ollama, capacity: 4, config: {base_url: %q}}
`, quicPort, fake.URL()))
	base = fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	start(t, "edged", bin.edged, "run", "--config", edgeConf, fmt.Sprintf("--test-liveness-divisor=%d", statusLiveness))
	node = start(t, "noded", bin.noded, "run", "--config", nodeConf)
	waitNode(t, base, "n1", "ready with ollama online", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online" && len(n.Providers[0].Targets) == 4
	})
	return base, node
}

// streamChat runs a streamed chat with the official OpenAI client and
// returns the answer's text.
func streamChat(ctx context.Context, base, model string, opts ...option.RequestOption) (string, error) {
	c := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused-on-loopback"), option.WithMaxRetries(0))
	s := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Think it over, then answer.")},
	}, opts...)
	var b strings.Builder
	for s.Next() {
		for _, ch := range s.Current().Choices {
			b.WriteString(ch.Delta.Content)
		}
	}
	return b.String(), s.Err()
}

// The page lists the Node and its provider; a run started by an OpenAI
// client appears live, in prefill (distinctly) and then streaming, and
// leaves the live list with its terminal counted; a Node killed outright
// is shown fenced within the (scaled) liveness profile. Nothing the page
// loads comes from anywhere but the Edge.
func TestStatusPageInARealBrowser(t *testing.T) {
	browser := requireBrowser(t)
	base, node := statusStack(t)
	page := openStatusPage(t, browser, base)

	// At rest: the Node and its provider, nothing in flight.
	v := page.wait("the Node n1, ready, with its ollama provider online", 15*time.Second, func(v pageView) bool {
		return len(v.Nodes) == 1 && v.Nodes[0].ID == "n1" && v.Nodes[0].State == "ready" &&
			len(v.Nodes[0].Providers) == 1 && v.Nodes[0].Providers[0].Name == "ollama" && v.Nodes[0].Providers[0].State == "online"
	})
	if pt := v.Nodes[0].Providers[0].Text; !strings.Contains(pt, "think:latest") || !strings.Contains(pt, "chat:latest") || !strings.Contains(pt, "0 / 4") {
		t.Errorf("the provider shows %q, want its targets and 0 of 4 slots in use", pt)
	}
	if len(v.Live) != 0 {
		t.Errorf("live at rest: %+v", v.Live)
	}
	page.shot("at-rest")

	// Some history for the terminals: answers that completed, one that
	// failed. The completed ones are turns of one session (issue 21): the
	// first is new, the next two stick to its Node.
	for _, m := range []string{"quick", "quick", "quick", "broken"} {
		text, err := streamChat(t.Context(), base, m, option.WithJSONSet("prompt_cache_key", "status-session"))
		if (m == "broken") != (err != nil) || m == "quick" && text == "" {
			t.Errorf("the %s chat: %q, %v", m, text, err)
		}
	}
	v = page.wait("three completed and one failed", 15*time.Second, func(v pageView) bool {
		failed := 0
		for reason, n := range v.Terminals {
			if reason != "completed" {
				failed += n
			}
		}
		return v.Terminals["completed"] == 3 && failed == 1 && len(v.Recent) == 4
	})
	// The failed one never ran: its turn is not counted.
	if got := v.Tiles["sessions"]; got != "2 / 2" {
		t.Errorf("the sessions tile shows %q, want 2 / 2 (two turns on their session's last server, none moved)", got)
	}

	// Under load: three chats stream while one run sits in its prefill.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	type answer struct {
		model, text string
		err         error
	}
	answers := make(chan answer, 4)
	for _, m := range []string{"chat", "chat", "chat", "think"} {
		go func() {
			text, err := streamChat(ctx, base, m)
			answers <- answer{m, text, err}
		}()
	}
	// The think run holds its prefill for 3 s, while the chats stream.
	underLoad := func(tokens int) func(v pageView) bool {
		return func(v pageView) bool {
			prefill, streaming := 0, 0
			for _, r := range v.Live {
				switch {
				case r.Model == "think" && r.Phase == "prefill":
					prefill++
				case r.Model == "chat" && r.Phase == "streaming" && r.Tokens >= tokens:
					streaming++
				}
			}
			return prefill == 1 && streaming >= 1
		}
	}
	v = page.wait("the think run in prefill while chats stream", 20*time.Second, underLoad(1))
	// For the screenshot, a few tokens more if the prefill lasts.
	if more, ok := page.poll(1500*time.Millisecond, underLoad(8)); ok {
		v = more
	}
	var think string
	for _, r := range v.Live {
		if r.Model != "think" {
			continue
		}
		think = r.ID
		if r.Kind != "run" || r.Node != "n1" || !strings.Contains(r.Badge, "prefill") || r.Tokens != 0 {
			t.Errorf("the think run in prefill shows %+v, want a run on n1 with a prefill badge and no tokens", r)
		}
	}
	shot := page.shot("under-load")
	if dst := os.Getenv("IOP_STATUS_PAGE_PNG"); dst != "" && shot != "" {
		b, err := os.ReadFile(shot)
		if err == nil {
			err = os.WriteFile(dst, b, 0o644)
		}
		if err != nil {
			t.Errorf("copy the screenshot to %s: %v", dst, err)
		}
	}

	v = page.wait("the think run streaming", 20*time.Second, func(v pageView) bool {
		for _, r := range v.Live {
			if r.ID == think && r.Phase == "streaming" && r.Tokens > 0 {
				return true
			}
		}
		return false
	})
	for range 4 {
		a := <-answers
		if a.err != nil || a.text == "" {
			t.Errorf("the %s chat: %q, %v; want a complete answer", a.model, a.text, a.err)
		}
	}
	v = page.wait("the think run gone from the live list, completed", 15*time.Second, func(v pageView) bool {
		for _, r := range v.Live {
			if r.ID == think {
				return false
			}
		}
		for _, r := range v.Recent {
			if r.ID == think {
				return r.Reason == "completed" && v.Terminals["completed"] == 3+4
			}
		}
		return false
	})
	if len(v.Live) != 0 {
		t.Errorf("live after every answer: %+v", v.Live)
	}
	page.shot("after-load")

	// The Node killed outright: nothing tells the Edge but the silence, so
	// the heartbeat fences it: within one interval and one response wait
	// of the scaled profile, and a margin for a loaded machine.
	live := quicwire.DefaultLiveness.Scaled(statusLiveness)
	within := live.Interval + live.ResponseWait + 5*time.Second
	killed := time.Now()
	if err := node.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	v = page.wait("n1 fenced with heartbeat_timeout", within, func(v pageView) bool {
		return len(v.Nodes) == 1 && v.Nodes[0].State == "fenced" && strings.Contains(v.Nodes[0].Text, "heartbeat_timeout")
	})
	t.Logf("the page showed n1 fenced %.1fs after kill -9 (bound %v)", time.Since(killed).Seconds(), within)
	if ps := v.Nodes[0].Providers; len(ps) != 1 || ps[0].State != "offline" {
		t.Errorf("a fenced Node's providers show %+v, want offline (R9)", ps)
	}
	page.shot("fenced")

	// It works without a network: every request went to the Edge.
	page.mu.Lock()
	defer page.mu.Unlock()
	for _, u := range page.requests {
		if !strings.HasPrefix(u, base+"/") {
			t.Errorf("the page requested %s, outside the Edge", u)
		}
	}
	if len(page.requests) < 10 {
		t.Errorf("the page made %d requests: %q; did it poll?", len(page.requests), page.requests)
	}
	if len(page.errors) > 0 {
		t.Errorf("the page logged errors: %q", page.errors)
	}
}

// Where the admin reads need an admin's key, the page (served to anyone)
// asks for one: a key that is not an admin's is refused with the Edge's
// reason, an admin's shows the status, kept for the tab (a reload needs no
// key) until "Forget key". The key goes to the Edge only.
func TestStatusPageAsksForAnAdminKeyWhereReadsNeedOne(t *testing.T) {
	browser := requireBrowser(t)
	cfg := edgeconfig.Default()
	cfg.Principals = []edgeconfig.Principal{{Name: "ops", Routes: []string{"*"}, Admin: true}, {Name: "app", Routes: []string{"*"}}}
	cfg.API.Keys = []edgeconfig.APIKey{{Principal: "ops", SHA256: auth.HashKey("ops-key")}, {Principal: "app", SHA256: auth.HashKey("app-key")}}
	authn, err := auth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runs := inflight.New(inflight.Options{})
	runs.Start(inflight.Work{Kind: inflight.Run, ID: "run-guarded", API: "openai_chat", Model: "m", Principal: "app"}).Dispatched("n1", "ollama", "m:latest")
	admin := adminapi.Handler(fleet1.New(fleet1.Options{}), func() error { return nil }, adminapi.Options{Authenticator: authn, Runs: runs})
	mux := http.NewServeMux()
	mux.Handle("/admin/", admin)
	mux.Handle(statuspage.Path, statuspage.Handler())
	mux.Handle(statuspage.Path+"/", statuspage.Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	p := newBrowserPage(t, browser, srv.URL)
	p.open()
	p.wait("the key form", 15*time.Second, func(v pageView) bool { return v.Locked && !v.Loaded && v.Conn == "locked" })
	enter := func(key string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
		defer cancel()
		if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#key"), key), chromedp.Click(chromedp.CSS("#keyform button[type=submit]"))); err != nil {
			t.Fatalf("enter the key: %v", err)
		}
	}
	enter("app-key")
	p.wait("the non-admin key refused, with the Edge's reason", 10*time.Second, func(v pageView) bool {
		return v.Locked && strings.Contains(v.Why, "refused (403)") && strings.Contains(v.Why, `principal "app" is not one`)
	})
	enter("ops-key")
	v := p.wait("the status, with the admin key", 10*time.Second, func(v pageView) bool { return v.Loaded && !v.Locked })
	if len(v.Live) != 1 || v.Live[0].ID != "run-guarded" || v.Live[0].Phase != "prefill" {
		t.Errorf("live with the admin key: %+v, want run-guarded in prefill", v.Live)
	}
	// A reload keeps the key for the tab.
	if err := chromedp.Do(p.ctx, chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	p.wait("the status again after a reload, without asking", 10*time.Second, func(v pageView) bool { return v.Loaded && !v.Locked })
	if err := chromedp.Do(p.ctx, chromedp.Click(chromedp.CSS("#forget"))); err != nil {
		t.Fatal(err)
	}
	p.wait("the key form after Forget key", 10*time.Second, func(v pageView) bool { return v.Locked })

	p.mu.Lock()
	defer p.mu.Unlock()
	for _, u := range p.requests {
		if !strings.HasPrefix(u, srv.URL+"/") {
			t.Errorf("the page requested %s, outside the Edge", u)
		}
	}
}
