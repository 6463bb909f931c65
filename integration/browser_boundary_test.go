package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/ollama/ollama/api"
	"github.com/openai/openai-go/v3"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// pageRequest is a request as a web page in a browser would make it, or a program with a key.
type pageRequest struct {
	method, path string
	host         string            // the Host header; "" sends the address dialled
	header       map[string]string // Origin, Sec-Fetch-Site, Content-Type, Authorization...
	body         string
}

// send sends pr to base with c and returns the status, the headers and the body.
func (pr pageRequest) send(t *testing.T, c *http.Client, base string) (int, http.Header, string) {
	t.Helper()
	var body io.Reader
	if pr.body != "" {
		body = strings.NewReader(pr.body)
	}
	req, err := http.NewRequestWithContext(t.Context(), pr.method, base+pr.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if pr.host != "" {
		req.Host = pr.host
	}
	for k, v := range pr.header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", pr.method, pr.path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// pageHeaders are h and kv, for a request's headers.
func pageHeaders(h map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range h {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

var (
	jsonType  = map[string]string{"Content-Type": "application/json"}
	crossSite = map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
)

// Issue 24, gap 1, in the single-machine setup of the README (loopback, no keys: every request
// is anonymous): a page that rebinds its own name to 127.0.0.1 cannot use the Edge or read its
// fleet or metrics, and a page of another site cannot run a model with a text/plain or form
// POST. The programs that use this setup (the OpenAI SDK with its placeholder key, the Ollama
// client) are served as before, and health stays answerable by anyone.
func TestPagesCannotUseALoopbackEdge(t *testing.T) {
	fake := fakeollama.New(fakeollama.Model{Name: "tiny:latest", Text: "hello program"})
	defer fake.Close()
	s := startClientStack(t, fake, func(*clientStack) string { return "routes: [{name: tiny, model: tiny}]\n" })
	base := fmt.Sprintf("http://127.0.0.1:%d", s.httpPort)
	waitReady(t, http.DefaultClient, base, "")
	rebound := fmt.Sprintf("attacker.example:%d", s.httpPort) // what the browser sends after rebinding
	chat := `{"model":"tiny","stream":false,"messages":[{"role":"user","content":"hi"}]}`

	for _, tt := range []struct {
		name string
		req  pageRequest
		want int
		says string // in the body of a refusal
	}{
		{"rebinding: chat", pageRequest{"POST", "/v1/chat/completions", rebound, jsonType, chat}, 403, `"code":"host_not_allowed"`},
		{"rebinding: Ollama chat", pageRequest{"POST", "/api/chat", rebound, jsonType, chat}, 403, "api.allowed_hosts"},
		{"rebinding: the fleet", pageRequest{"GET", "/admin/v1/nodes", rebound, nil, ""}, 403, "api.allowed_hosts"},
		{"rebinding: the metrics", pageRequest{"GET", "/metrics", rebound, nil, ""}, 403, "api.allowed_hosts"},
		{"rebinding: health", pageRequest{"GET", "/healthz", rebound, nil, ""}, 200, ""},
		{"rebinding: readiness", pageRequest{"GET", "/readyz", rebound, nil, ""}, 200, ""},
		{"cross-site text/plain", pageRequest{"POST", "/v1/chat/completions", "", pageHeaders(crossSite, "Content-Type", "text/plain;charset=UTF-8"), chat}, 403, "cross_site_request"},
		{"cross-site form", pageRequest{"POST", "/api/generate", "", pageHeaders(crossSite, "Content-Type", "application/x-www-form-urlencoded"),
			`{"model":"tiny","prompt":"hi","stream":false,"x":"=1"}`}, 403, "api.allowed_origins"},
		{"cross-site multipart, old browser", pageRequest{"POST", "/api/chat", "", map[string]string{"Origin": "https://evil.example", "Content-Type": "multipart/form-data; boundary=x"},
			"--x--"}, 403, "api.allowed_origins"},
		{"text/plain, no browser headers", pageRequest{"POST", "/v1/chat/completions", "", map[string]string{"Content-Type": "text/plain"}, chat}, 415, "Content-Type: application/json"},
		{"form, no browser headers", pageRequest{"POST", "/api/chat", "", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, chat}, 415, "Content-Type: application/json"},
		{"JSON by address", pageRequest{"POST", "/v1/chat/completions", "", jsonType, chat}, 200, ""},
		{"JSON by localhost", pageRequest{"POST", "/api/chat", fmt.Sprintf("localhost:%d", s.httpPort), jsonType, chat}, 200, ""},
		{"JSON without a content type", pageRequest{"POST", "/v1/chat/completions", "", nil, chat}, 200, ""},
		{"the fleet by address", pageRequest{"GET", "/admin/v1/nodes", "", nil, ""}, 200, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, _, body := tt.req.send(t, http.DefaultClient, base)
			if code != tt.want || !strings.Contains(body, tt.says) {
				t.Errorf("%s %s (Host %q) = %d %s; want %d saying %q", tt.req.method, tt.req.path, tt.req.host, code, body, tt.want, tt.says)
			}
		})
	}

	// The programs of this setup, unchanged: the OpenAI SDK sends a placeholder key and JSON,
	// the Ollama client JSON; both name the Edge by address.
	programs := &stack{base: base}
	sdk := programs.openai()
	out, err := sdk.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if err != nil || out.Choices[0].Message.Content != "hello program" {
		t.Errorf("the OpenAI SDK: %v", err)
	}
	var said strings.Builder
	stream := false
	if err := programs.ollama(t).Chat(t.Context(), &api.ChatRequest{Model: "tiny", Stream: &stream,
		Messages: []api.Message{{Role: "user", Content: "hi"}}}, func(r api.ChatResponse) error {
		said.WriteString(r.Message.Content)
		return nil
	}); err != nil || said.String() != "hello program" {
		t.Errorf("the Ollama client: %q, %v", said.String(), err)
	}

	// Counted by kind, and logged.
	_, _, metrics := pageRequest{"GET", "/metrics", "", nil, ""}.send(t, http.DefaultClient, base)
	for _, kind := range []string{auth.RefusedHost, auth.RefusedCrossSite, auth.RefusedContentType} {
		if v := metricValue(metrics, `iop_edge_refusals_total{kind="`+kind+`"}`); v < 1 {
			t.Errorf("iop_edge_refusals_total{kind=%q} = %v; want the refusals counted", kind, v)
		}
	}
	s.edge.waitOutput(regexp.MustCompile(`client request without a key refused.*host=attacker\.example`))
}

// The same in `go run ./edged/dev`, the README's first command: a rebinding page reads neither
// the fleet nor the metrics nor a model's answer.
func TestPagesCannotUseTheDevCommandsEdge(t *testing.T) {
	dev := start(t, "dev", bin.dev, "--http-addr", fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp")))
	base := dev.waitOutput(regexp.MustCompile(`Edge HTTP API\s+(http://\S+)`))
	waitNode(t, base, "dev-node", "ready", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
	})
	host := "rebind.attacker.example:" + base[strings.LastIndex(base, ":")+1:]
	chat := `{"model":"sim-small","messages":[{"role":"user","content":"hi"}]}`
	for _, pr := range []pageRequest{
		{"POST", "/v1/chat/completions", host, jsonType, chat},
		{"GET", "/admin/v1/nodes", host, nil, ""},
		{"GET", "/admin/v1/queues", host, nil, ""},
		{"GET", "/metrics", host, nil, ""},
		{"POST", "/v1/chat/completions", "", pageHeaders(crossSite, "Content-Type", "text/plain"), chat},
	} {
		if code, _, body := pr.send(t, http.DefaultClient, base); code != http.StatusForbidden {
			t.Errorf("%s %s (Host %q) = %d %s; want 403", pr.method, pr.path, pr.host, code, body)
		}
	}
	if code, _, body := (pageRequest{"POST", "/v1/chat/completions", "", jsonType, chat}).send(t, http.DefaultClient, base); code != http.StatusOK {
		t.Errorf("a program's chat = %d %s", code, body)
	}
}

// With keys, a trusted network, a listed host and a listed origin: a key is never checked,
// a trusted network's client is checked like anonymous, a listed name and a listed origin's
// page are served (the page with CORS), and a reload changes the lists.
func TestKeysListedHostsAndOriginsLetTheirRequestsIn(t *testing.T) {
	fake := fakeollama.New(fakeollama.Model{Name: "tiny:latest", Text: "hello page"})
	defer fake.Close()
	const key = "sk-browser-boundary-0001"
	config := func(hosts string) string {
		return fmt.Sprintf(`
api:
  keys: [{principal: app, sha256: %s}]
  trusted_networks: [{cidr: 127.0.0.2/32, principal: lan}]
  admin_reads: open
  allowed_hosts: [%s]
  allowed_origins: ['https://chat.example']
principals:
  - {name: app, routes: ['*']}
  - {name: lan, routes: [tiny]}
routes: [{name: tiny, model: tiny}]
`, auth.HashKey(key), hosts)
	}
	s := startClientStack(t, fake, func(*clientStack) string { return config("edge.lan") })
	base := fmt.Sprintf("http://127.0.0.1:%d", s.httpPort)
	waitReady(t, http.DefaultClient, base, key)
	port := fmt.Sprint(s.httpPort)
	chat := `{"model":"tiny","stream":false,"messages":[{"role":"user","content":"hi"}]}`
	keyed := map[string]string{"Authorization": "Bearer " + key}
	lan, elsewhere := fromAddr("127.0.0.2"), fromAddr("127.0.0.3")

	for _, tt := range []struct {
		name string
		c    *http.Client
		req  pageRequest
		want int
	}{
		{"rebinding with a key", elsewhere, pageRequest{"POST", "/v1/chat/completions", "attacker.example:" + port, pageHeaders(keyed, "Content-Type", "application/json"), chat}, 200},
		{"rebinding with a key: the fleet", elsewhere, pageRequest{"GET", "/admin/v1/nodes", "attacker.example:" + port, keyed, ""}, 200},
		{"cross-site text/plain with a key", elsewhere, pageRequest{"POST", "/v1/chat/completions", "", pageHeaders(pageHeaders(keyed, "Content-Type", "text/plain"), "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"), chat}, 200},
		{"form with a key", elsewhere, pageRequest{"POST", "/api/chat", "", pageHeaders(keyed, "Content-Type", "application/x-www-form-urlencoded"), chat}, 200},
		{"no key from elsewhere: 401 as before", elsewhere, pageRequest{"POST", "/v1/chat/completions", "attacker.example:" + port, jsonType, chat}, 401},
		{"the fleet without a key, open reads", elsewhere, pageRequest{"GET", "/admin/v1/nodes", "attacker.example:" + port, nil, ""}, 403},
		{"trusted network, rebinding", lan, pageRequest{"POST", "/v1/chat/completions", "attacker.example:" + port, jsonType, chat}, 403},
		{"trusted network, cross-site", lan, pageRequest{"POST", "/api/chat", "", pageHeaders(crossSite, "Content-Type", "text/plain"), chat}, 403},
		{"trusted network, text/plain", lan, pageRequest{"POST", "/api/chat", "", map[string]string{"Content-Type": "text/plain"}, chat}, 415},
		{"trusted network, by the listed name", lan, pageRequest{"POST", "/v1/chat/completions", "EDGE.LAN:" + port, jsonType, chat}, 200},
		{"trusted network, from the listed origin", lan, pageRequest{"POST", "/v1/chat/completions", "",
			pageHeaders(jsonType, "Origin", "https://chat.example", "Sec-Fetch-Site", "cross-site"), chat}, 200},
		{"trusted network, by a name not yet listed", lan, pageRequest{"POST", "/v1/chat/completions", "gpu.lan:" + port, jsonType, chat}, 403},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if code, _, body := tt.req.send(t, tt.c, base); code != tt.want {
				t.Errorf("%s %s (Host %q) = %d %s; want %d", tt.req.method, tt.req.path, tt.req.host, code, body, tt.want)
			}
		})
	}

	// CORS: the listed origin's preflight and answer carry it; another origin's get none.
	preflight := func(origin string) (int, http.Header) {
		code, h, _ := pageRequest{"OPTIONS", "/v1/chat/completions", "", map[string]string{"Origin": origin, "Sec-Fetch-Site": "cross-site",
			"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type, x-stainless-lang"}, ""}.send(t, lan, base)
		return code, h
	}
	if code, h := preflight("https://chat.example"); code != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "https://chat.example" ||
		!strings.Contains(strings.ToLower(h.Get("Access-Control-Allow-Headers")), "authorization") {
		t.Errorf("preflight from the listed origin = %d %v", code, h)
	}
	if code, h := preflight("https://evil.example"); code != http.StatusForbidden || h.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight from another origin = %d %v; want 403 without CORS", code, h)
	}
	code, h, body := pageRequest{"POST", "/v1/chat/completions", "", pageHeaders(jsonType, "Origin", "https://chat.example", "Sec-Fetch-Site", "cross-site"), chat}.send(t, lan, base)
	var answer struct {
		Choices []struct{ Message struct{ Content string } }
	}
	if json.Unmarshal([]byte(body), &answer); code != 200 || h.Get("Access-Control-Allow-Origin") != "https://chat.example" ||
		len(answer.Choices) != 1 || answer.Choices[0].Message.Content != "hello page" {
		t.Errorf("chat from the listed origin = %d %v %s", code, h, body)
	}

	// A reload lists another name.
	s.write(t, config("edge.lan, gpu.lan"))
	if err := s.edge.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	s.edge.waitOutput(regexp.MustCompile(`config reloaded.*by=SIGHUP`))
	// Reload applies the file before it logs "config reloaded".
	if code, _, body := (pageRequest{"POST", "/v1/chat/completions", "gpu.lan:" + port, jsonType, chat}).send(t, lan, base); code != http.StatusOK {
		t.Errorf("gpu.lan after the reload = %d %s", code, body)
	}
}

// evaluate runs the script (an async function's body, returning a JSON-able value) in the
// page open in ctx and decodes what it returns into v.
func evaluate(t *testing.T, ctx context.Context, script string, v any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(async () => JSON.stringify(await (async () => {`+script+`})()))()`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("evaluate: %v", err)
	}
	if err := json.Unmarshal([]byte(raw), v); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
}

// The same in a real Chromium: a page whose name rebinds to the Edge's address cannot read
// the fleet, the metrics or a model's answer; another site's page cannot run a model with a
// no-cors text/plain fetch or a text/plain form crafted to be JSON (the classic trick); and a
// listed origin's page calls the Edge with CORS and reads the answer. Names resolve through
// Chromium's host resolver rules, all to 127.0.0.1.
func TestARealBrowsersPagesAgainstALoopbackEdge(t *testing.T) {
	browser := requireBrowser(t)
	pages := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, "<!doctype html><title>a page</title>")
	}))
	defer pages.Close()
	pagePort := pages.URL[strings.LastIndex(pages.URL, ":")+1:]
	good, evil := "http://good.test:"+pagePort, "http://evil.test:"+pagePort

	fake := fakeollama.New(fakeollama.Model{Name: "tiny:latest", Text: "hello page"})
	defer fake.Close()
	s := startClientStack(t, fake, func(*clientStack) string {
		return fmt.Sprintf("api: {allowed_origins: [%q]}\nroutes: [{name: tiny, model: tiny}]\n", good)
	})
	edge := fmt.Sprintf("http://127.0.0.1:%d", s.httpPort)
	waitReady(t, http.DefaultClient, edge, "")
	ran := func() int {
		n := 0
		for _, r := range fake.Requests() {
			if r.Path == "/api/chat" || r.Path == "/api/generate" {
				n++
			}
		}
		return n
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.UserDataDir(t.TempDir()),
		chromedp.DisableGPU, chromedp.NoSandbox,
		chromedp.Flag("host-resolver-rules", "MAP attacker.example 127.0.0.1, MAP good.test 127.0.0.1, MAP evil.test 127.0.0.1"))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	navigate := func(url string) {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
			t.Fatalf("navigate to %s: %v", url, err)
		}
	}
	chat := `{"model":"tiny","stream":false,"messages":[{"role":"user","content":"hi"}]}`

	// DNS rebinding: the page's origin is attacker.example on the Edge's port, so its requests
	// are same-origin to the browser, and it could read every answer.
	navigate(fmt.Sprintf("http://attacker.example:%d/", s.httpPort)) // the Ollama root: open to anyone
	var rebound map[string]int
	evaluate(t, ctx, `
		const out = {};
		for (const p of ['/admin/v1/nodes', '/admin/v1/queues', '/metrics', '/api/tags']) out[p] = (await fetch(p)).status;
		out.chat = (await fetch('/v1/chat/completions', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: `+"`"+chat+"`"+`})).status;
		return out;`, &rebound)
	for what, code := range rebound {
		if code != http.StatusForbidden {
			t.Errorf("the rebound page's %s = %d; want 403", what, code)
		}
	}

	// Cross-site: another site's page posts without asking; it cannot read the answer, but
	// before, the model ran.
	navigate(evil + "/")
	var sent string
	evaluate(t, ctx, `
		await fetch('`+edge+`/v1/chat/completions', {method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'}, body: `+"`"+chat+"`"+`});
		return 'sent';`, &sent)
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`(() => {
		const f = document.createElement('form');
		f.method = 'POST'; f.enctype = 'text/plain'; f.action = '`+edge+`/api/generate';
		const i = document.createElement('input');
		i.name = '{"model":"tiny","stream":false,"prompt":"hi","x":"'; i.value = '"}';
		f.appendChild(i); document.body.appendChild(f); f.submit();
	})()`)); err != nil {
		t.Fatalf("form post: %v", err)
	}
	refused := func() float64 {
		_, _, metrics := pageRequest{"GET", "/metrics", "", nil, ""}.send(t, http.DefaultClient, edge)
		return metricValue(metrics, `iop_edge_refusals_total{kind="browser_cross_site"}`)
	}
	waitFor(t, "the fetch and the form to reach the Edge", func() bool { return refused()+float64(ran()) >= 2 })
	if n := refused(); n != 2 {
		t.Errorf("cross-site refusals counted: %v; want the fetch and the form", n)
	}
	if n := ran(); n != 0 {
		t.Errorf("another site's page ran the model %d times", n)
	}

	// The listed origin: a preflight, then the answer, readable by the page.
	navigate(good + "/")
	var listed struct {
		Status  int
		Content string
	}
	evaluate(t, ctx, `
		const r = await fetch('`+edge+`/v1/chat/completions', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: `+"`"+chat+"`"+`});
		const b = await r.json();
		return {status: r.status, content: b.choices ? b.choices[0].message.content : JSON.stringify(b)};`, &listed)
	if listed.Status != http.StatusOK || listed.Content != "hello page" {
		t.Errorf("the listed origin's page: %d %q; want the answer", listed.Status, listed.Content)
	}
}
