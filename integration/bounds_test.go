package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// boundedEdge runs edged (loopback) with extra config and one noded whose
// Ollama provider (capacity 1) is fake, and returns the Edge's base URL.
func boundedEdge(t *testing.T, fake *fakeollama.Server, extra string) string {
	t.Helper()
	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	edgeConf := filepath.Join(dir, "edge.yaml")
	writeFile(t, edgeConf, fmt.Sprintf("listen: {quic: \"127.0.0.1:%d\", http: \"127.0.0.1:%d\"}\nidentity: {mode: loopback}\n%s", quicPort, httpPort, extra))
	start(t, "edged", bin.edged, "run", "--config", edgeConf)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	if fake != nil {
		nodeConf := filepath.Join(dir, "node.yaml")
		writeFile(t, nodeConf, fmt.Sprintf(`
node_id: n1
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
providers: [{name: ollama, adapter: ollama, capacity: 1, config: {base_url: %q}}]
`, quicPort, fake.URL()))
		start(t, "noded", bin.noded, "run", "--config", nodeConf)
	}
	return base
}

// P3, issue 10 item 2: a client that stops reading its stream, on either
// API, is ended at the profile's idle timeout and the provider slot it held
// is freed: the next request on that one-slot model is served. Before the
// write deadline, two such clients held a model's capacity forever.
func TestAClientThatStopsReadingFreesItsSlot(t *testing.T) {
	word := strings.Repeat("x", 30_000)
	fake := fakeollama.New(fakeollama.Model{Name: "big:latest", Text: strings.TrimSpace(strings.Repeat(word+" ", 1000))},
		fakeollama.Model{Name: "small:latest", TokenCount: 3})
	defer fake.Close()
	base := boundedEdge(t, fake, `
api: {allow_anonymous: true}
profiles: [{name: default, idle_timeout: 2s, queue_timeout: 30s}]
`)
	waitNode(t, base, "n1", "ready", func(n nodeView) bool { return n.State == "ready" && n.Providers[0].State == "online" })
	host := strings.TrimPrefix(base, "http://")

	for _, api := range []struct{ path, body, next string }{
		{"/v1/chat/completions", `{"model":"big","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"small","messages":[{"role":"user","content":"hi"}]}`},
		{"/api/chat", `{"model":"big","messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"small","stream":false,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		t.Run(api.path, func(t *testing.T) {
			conn, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.(*net.TCPConn).SetReadBuffer(4 << 10)
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", api.path, len(api.body), api.body)
			line, err := bufio.NewReader(conn).ReadString('\n')
			if err != nil || !strings.Contains(line, " 200 ") {
				t.Fatalf("status line %q: %v", line, err)
			}
			// The slot is taken and the client reads nothing more. The next
			// request queues behind it until the stalled client is ended.
			began := time.Now()
			resp, err := (&http.Client{Timeout: 60 * time.Second}).Post(base+api.path, "application/json", strings.NewReader(api.next))
			if err != nil {
				t.Fatalf("the request behind a client that stopped reading: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("the request behind a client that stopped reading: %d %s", resp.StatusCode, b)
			}
			t.Logf("%s: the slot was freed and the next request served %v after the first client stopped reading (idle timeout 2s)",
				api.path, time.Since(began).Round(10*time.Millisecond))
		})
	}
}

// P3, issue 10 items 6 and 7, on the real daemon: connections past
// limits.max_connections are closed at once and counted; the admin reads and
// /metrics answer only an admin key when keys are configured; a known path
// with the wrong method is 405.
func TestTheFrontDoorOfTheRealEdge(t *testing.T) {
	base := boundedEdge(t, nil, fmt.Sprintf(`
limits: {max_connections: 4}
principals:
  - {name: ops, routes: ["*"], admin: true}
  - {name: app, routes: ["*"]}
api:
  keys:
    - {principal: ops, sha256: %s}
    - {principal: app, sha256: %s}
`, auth.HashKey("ops-key"), auth.HashKey("app-key")))
	host := strings.TrimPrefix(base, "http://")
	get := func(path, key string) int {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := (&http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	waitFor(t, "edged serving", func() bool { return get("/healthz", "") == http.StatusOK })

	for _, path := range []string{"/admin/v1/nodes", "/admin/v1/queues", "/metrics"} {
		for key, want := range map[string]int{"": 401, "app-key": 403, "ops-key": 200} {
			if got := get(path, key); got != want {
				t.Errorf("GET %s with key %q = %d, want %d", path, key, got, want)
			}
		}
	}
	if got := get("/v1/chat/completions", "app-key"); got != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/chat/completions = %d, want 405", got)
	}

	// Four kept-alive connections fill the cap; the fifth is closed at
	// once. Each of the four is proven accepted by a request on it (a
	// connection of the checks above may take a moment to be counted out;
	// then the dial is refused and tried again).
	var idle []net.Conn
	for len(idle) < 4 {
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: edge\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			c.Close()
			time.Sleep(50 * time.Millisecond)
			continue
		}
		resp.Body.Close()
		c.SetReadDeadline(time.Time{})
		defer c.Close()
		idle = append(idle, c)
	}
	c, err := net.Dial("tcp", host)
	if err == nil {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: edge\r\n\r\n")
		if n, err := c.Read(make([]byte, 64)); n > 0 || err == nil {
			t.Errorf("a connection past the cap was served (read %d bytes, %v)", n, err)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Error("a connection past the cap was left open")
		}
		c.Close()
	}
	idle[0].Close()
	waitFor(t, "a request once a connection is free", func() bool { return get("/healthz", "") == http.StatusOK })
	for _, c := range idle[1:] {
		c.Close()
	}
	waitFor(t, "the refusal counted", func() bool {
		req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer ops-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return metricValue(string(b), `iop_edge_refusals_total{kind="http_connections"}`) > 0
	})
}
