package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// The front door against clients that hold what they get for as long as
// they can, with raw sockets against the real edged (issue 24, gaps 4 and
// 5; SPEC P3).

// Keys of the abuse tests: hog may use only the route "small"; app every
// route.
const (
	doorHogKey = "sk-hog-abuse-0001"
	doorAppKey = "sk-app-abuse-0002"
)

// abuseKeys is the access part of an abuse test's edge.yaml.
func abuseKeys() string {
	return fmt.Sprintf(`
api:
  keys: [{principal: hog, sha256: %s}, {principal: app, sha256: %s}]
  admin_reads: open
principals:
  - {name: hog, routes: [small]}
  - {name: app, routes: ['*']}
routes: [{name: small, model: small}, {name: tiny, model: tiny}]
`, auth.HashKey(doorHogKey), auth.HashKey(doorAppKey))
}

// abuseStack runs edged with abuseKeys and extra, and one noded serving
// the fake models tiny and small; it returns the Edge's base URL once
// both models are offered.
func abuseStack(t *testing.T, extra string) string {
	t.Helper()
	fake := fakeollama.New(fakeollama.Model{Name: "tiny:latest", TokenCount: 3}, fakeollama.Model{Name: "small:latest", TokenCount: 3})
	t.Cleanup(fake.Close)
	base := boundedEdge(t, fake, abuseKeys()+extra)
	waitNode(t, base, "n1", "ready", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online" && len(n.Providers[0].Targets) == 2
	})
	return base
}

// declareBody opens a connection and sends the header of a chat request
// with key that declares a body of size bytes and asks for 100-continue:
// the Edge answers "100 Continue" when it starts reading the body, so the
// caller knows the body's memory is being taken. It returns the
// connection and its reader, after that answer.
func declareBody(t *testing.T, host, key string, size int) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n", key, size)
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, " 100 ") {
		t.Fatalf("a declared body: %q, %v; want 100 Continue as the Edge starts reading it", line, err)
	}
	for line != "\r\n" && err == nil {
		line, err = br.ReadString('\n')
	}
	c.SetReadDeadline(time.Time{})
	return c, br
}

// chatAs sends a small chat request for model with key and returns its
// status, body and how long it took.
func chatAs(t *testing.T, base, key, model string) (int, string, time.Duration) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	began := time.Now()
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("chat as %s: %v", key, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), time.Since(began)
}

// Gap 4: two connections that declare the largest body (32 MiB) and send
// none of it took the whole body memory up front, and every other body was
// refused with 503 for up to a minute, whatever its key. Memory is now
// taken as the bytes arrive: the two hold a chunk each, and a request of
// another key is served at once.
func TestTwoSilentUploadsDoNotStarveOtherBodies(t *testing.T) {
	base := abuseStack(t, "")
	host := strings.TrimPrefix(base, "http://")
	for range 2 {
		declareBody(t, host, doorHogKey, 32<<20)
	}
	code, body, took := chatAs(t, base, doorAppKey, "tiny")
	if code != http.StatusOK {
		t.Fatalf("a chat request behind two silent 32 MiB uploads: %d %s (after %v); want it served", code, body, took)
	}
	// The hog's own next request is served too: its silent uploads hold
	// a chunk each, far from its share.
	if code, body, _ := chatAs(t, base, doorHogKey, "small"); code != http.StatusOK {
		t.Fatalf("the hog's own request: %d %s", code, body)
	}
	t.Logf("a chat request behind two silent 32 MiB uploads was served in %v", took.Round(time.Millisecond))
}

// Gap 4: a key that sends bodies as fast as it can holds at most its share
// of body memory (limits.body_memory_per_principal_percent, half by
// default): two nearly whole 32 MiB bodies of one key do not both fit, the
// one that finds the share taken is refused with 503 naming the share, and
// another key's request is served meanwhile.
func TestAKeyHoldsNoMoreThanItsShareOfBodyMemory(t *testing.T) {
	base := abuseStack(t, "")
	host := strings.TrimPrefix(base, "http://")
	const size = 32 << 20
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	type answer struct{ status, body string }
	answers := make(chan answer, 2)
	var conns []net.Conn
	var wg sync.WaitGroup
	for range 2 {
		c, br := declareBody(t, host, doorHogKey, size)
		conns = append(conns, c)
		// All but the last MiB, then nothing: the body holds what it
		// took until it is answered. The answer is read as the body is
		// written, so a refusal is seen even if the Edge stops reading.
		wg.Go(func() {
			for range size>>20 - 1 {
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
		})
		wg.Go(func() {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				answers <- answer{status: "no answer: " + err.Error()}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			answers <- answer{resp.Status, string(b)}
		})
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
		wg.Wait()
	}()
	var first answer
	select {
	case first = <-answers:
	case <-time.After(40 * time.Second):
		t.Fatal("neither of one key's two large bodies was answered within 40 s")
	}
	if !strings.HasPrefix(first.status, "503") || !strings.Contains(first.body, "body_memory_per_principal_percent") {
		t.Fatalf("one of one key's two large bodies: %s %s; want 503 naming limits.body_memory_per_principal_percent", first.status, first.body)
	}
	code, body, took := chatAs(t, base, doorAppKey, "tiny")
	if code != http.StatusOK {
		t.Fatalf("another key's request while the hog holds its share: %d %s (after %v)", code, body, took)
	}
	t.Logf("one key's second large body: %s %s; another key's request served in %v", first.status, strings.TrimSpace(first.body), took.Round(time.Millisecond))
}

// Gap 4: a body that trickles in is ended once it falls below
// limits.min_body_rate_kib (after a grace of a few seconds) with 408 and a
// message that says so, not held for the whole body timeout (a minute).
func TestATricklingBodyIsEndedWith408(t *testing.T) {
	base := abuseStack(t, "")
	host := strings.TrimPrefix(base, "http://")
	c, br := declareBody(t, host, doorHogKey, 1<<20)
	began := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c.Write([]byte(strings.Repeat(" ", 200))); err != nil {
					return // 1 KiB/s, until the Edge gives up
				}
			}
		}
	}()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("a body trickling at 1 KiB/s: no answer within 30 s: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	took := time.Since(began)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), "min_body_rate_kib") {
		t.Fatalf("a body trickling at 1 KiB/s: %d %s; want 408 naming limits.min_body_rate_kib", resp.StatusCode, b)
	}
	if took > 20*time.Second {
		t.Errorf("the trickle was ended after %v; want it ended within seconds of the grace", took)
	}
	t.Logf("a body trickling at 1 KiB/s ended after %v: %d %s", took.Round(100*time.Millisecond), resp.StatusCode, strings.TrimSpace(string(b)))
}

// Gap 4: a key none of whose routes can be served now (its only route's
// model is offered by no Node) is refused before the Edge reads any of its
// body: a request of it could only fail, whatever model the body names.
// A request without a valid key is refused before its body too, and its
// connection is not held open waiting for the body nobody will read (a
// short drain window, then the answer and the close).
func TestAKeyWithNoUsableRouteIsRefusedBeforeItsBody(t *testing.T) {
	fake := fakeollama.New(fakeollama.Model{Name: "tiny:latest", TokenCount: 3})
	defer fake.Close()
	const lostKey = "sk-lost-abuse-0003"
	base := boundedEdge(t, fake, fmt.Sprintf(`
api:
  keys: [{principal: lost, sha256: %s}, {principal: app, sha256: %s}]
  admin_reads: open
principals:
  - {name: lost, routes: [gone]}
  - {name: app, routes: ['*']}
routes: [{name: gone, model: nowhere}, {name: tiny, model: tiny}]
`, auth.HashKey(lostKey), auth.HashKey(doorAppKey)))
	waitNode(t, base, "n1", "ready", func(n nodeView) bool { return n.State == "ready" && n.Providers[0].State == "online" })
	host := strings.TrimPrefix(base, "http://")
	for _, tt := range []struct {
		name, auth string
		want       int
		inBody     string
	}{
		{"a key whose routes no Node serves", "Authorization: Bearer " + lostKey + "\r\n", http.StatusServiceUnavailable, "gone"},
		{"no key", "", http.StatusUnauthorized, ""},
		{"a wrong key", "Authorization: Bearer sk-wrong\r\n", http.StatusUnauthorized, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// The header alone, declaring a body (below net/http's own
			// 256 KiB drain, which would otherwise close the connection
			// at once) and sending none of it.
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\n%sContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n", tt.auth)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer before the body: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.want || !strings.Contains(string(b), tt.inBody) {
				t.Fatalf("answered %d %s; want %d before the body", resp.StatusCode, b, tt.want)
			}
			// The connection is closed: it would be waiting for a body
			// that is refused.
			if _, err := br.ReadByte(); err == nil {
				t.Errorf("the connection stayed open after its body was refused")
			} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Errorf("the connection stayed open after its body was refused")
			}
		})
	}
	if code, body, _ := chatAs(t, base, doorAppKey, "tiny"); code != http.StatusOK {
		t.Fatalf("a key with a usable route: %d %s", code, body)
	}
}

// keptAlive opens a connection, gets /healthz on it and leaves it open and
// idle; nil if the Edge closed it (at its cap).
func keptAlive(t *testing.T, host string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", host)
	if err != nil {
		return nil
	}
	if getHealthz(c, host) != nil {
		c.Close()
		return nil
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// getHealthz sends a request for /healthz on c, kept alive, and reads its
// answer.
func getHealthz(c net.Conn, host string) error {
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// closedByPeer reports whether the Edge has closed c.
func closedByPeer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	defer c.SetReadDeadline(time.Time{})
	_, err := c.Read(make([]byte, 1))
	ne, ok := err.(net.Error)
	return err != nil && !(ok && ne.Timeout())
}

// oneShot gets /healthz from base on a connection of its own, closed
// after the answer (so the test's own client holds no slot).
func oneShot(base string) error {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(base + "/healthz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// within polls f until it succeeds or d has passed, and returns how long
// it took, or f's last error.
func within(d time.Duration, f func() error) (time.Duration, error) {
	began := time.Now()
	for {
		err := f()
		if err == nil || time.Since(began) > d {
			return time.Since(began), err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Gap 5: idle keep-alive connections, one unauthenticated GET /healthz
// each, filled limits.max_connections and held it for the idle timeout
// (90 s): every new client and health probe was reset. Now a connection
// that has been quiet past a short grace gives its slot to a new one,
// oldest first; a new client and a health probe are served within
// seconds, and the flood's oldest connections are the ones closed.
func TestAnIdleKeepAliveFloodLeavesRoomForNewClients(t *testing.T) {
	const maxConns = 24
	base := boundedEdge(t, nil, fmt.Sprintf("limits: {max_connections: %d}\napi: {allow_anonymous: true}\n", maxConns))
	host := strings.TrimPrefix(base, "http://")
	if _, err := within(30*time.Second, func() error { return oneShot(base) }); err != nil {
		t.Fatalf("edged not serving: %v", err)
	}
	var flood []net.Conn
	for deadline := time.Now().Add(30 * time.Second); len(flood) < maxConns; {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d idle connections were accepted", len(flood), maxConns)
		}
		if c := keptAlive(t, host); c != nil {
			flood = append(flood, c)
			if len(flood) == 2 {
				// The door orders connections by when net/http reports
				// them idle, which its goroutine does after the client
				// has read the answer: on a loaded machine the next
				// connection can be idle first. A pause makes the first
				// two the quiet longest by far, whatever the scheduler
				// does.
				time.Sleep(time.Second)
			}
		}
	}
	// A new client, which keeps its connection: refused while every
	// connection is freshly idle, then let in by closing the one quiet
	// longest. Before, it was refused for the whole idle timeout.
	took, err := within(20*time.Second, func() error {
		if keptAlive(t, host) == nil {
			return fmt.Errorf("refused")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("a new client at a cap held by idle keep-alives: still refused %v after the cap filled: %v", took.Round(time.Second), err)
	}
	// A health probe, right after, the cap full again: served too, in
	// the slot of the next idle one.
	if probe, err := within(5*time.Second, func() error { return oneShot(base) }); err != nil {
		t.Fatalf("a health probe after the new client: refused for %v: %v", probe, err)
	}
	if !closedByPeer(flood[0]) || !closedByPeer(flood[1]) {
		t.Errorf("the two idle connections quiet longest were not the ones closed")
	}
	if closedByPeer(flood[len(flood)-1]) {
		t.Errorf("the newest idle connection was closed before older ones")
	}
	t.Logf("at a cap of %d idle keep-alives a new client was served %v after the cap filled", maxConns, took.Round(10*time.Millisecond))
}

// nonLoopbackIP is an IPv4 address of this host other than loopback, or ""
// if it has none.
func nonLoopbackIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

// Gap 5: one source address may hold at most
// limits.max_connections_per_source connections. Its next one is closed at
// once while its own are freshly idle, and takes the place of its own
// oldest once that has been quiet past the grace; other sources (here
// loopback, which the cap exempts: a reverse proxy on the host carries
// every client) are served throughout.
func TestOneSourceHoldsAtMostItsShareOfConnections(t *testing.T) {
	ip := nonLoopbackIP()
	if ip == "" {
		t.Skip("this host has no address besides loopback to connect from")
	}
	dir := t.TempDir()
	httpPort := freePort(t, "tcp")
	conf := dir + "/edge.yaml"
	writeFile(t, conf, fmt.Sprintf(`
listen: {quic: "127.0.0.1:%d", http: "0.0.0.0:%d"}
identity: {mode: loopback}
api: {keys: [{principal: app, sha256: %s}]}
principals: [{name: app, routes: ['*']}]
limits: {max_connections: 64, max_connections_per_source: 4}
`, freePort(t, "udp"), httpPort, auth.HashKey(doorAppKey)))
	start(t, "edged", bin.edged, "run", "--config", conf)
	remote := net.JoinHostPort(ip, fmt.Sprint(httpPort))
	local := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	if _, err := within(30*time.Second, func() error { return oneShot(local) }); err != nil {
		t.Fatalf("edged not serving: %v", err)
	}

	var held []net.Conn
	began := time.Now()
	for len(held) < 4 {
		if time.Since(began) > 30*time.Second {
			t.Fatalf("only %d of 4 connections from %s were accepted", len(held), ip)
		}
		if c := keptAlive(t, remote); c != nil {
			held = append(held, c)
		}
	}
	fifth := keptAlive(t, remote)
	switch {
	case fifth == nil:
	case time.Since(began) < 4*time.Second:
		t.Fatalf("a fifth connection from %s was served while its four were freshly idle; want it closed at max_connections_per_source 4", ip)
	default:
		t.Skipf("the machine took %v to open four connections: past the grace, so the fifth rightly took the place of the first", time.Since(began))
	}
	if err := oneShot(local); err != nil {
		t.Fatalf("a probe from loopback while %s holds its share: %v", ip, err)
	}
	for _, c := range held {
		if closedByPeer(c) {
			t.Errorf("a connection of %s within its share was closed", ip)
		}
	}
	// The others speak again, so that held[0] is the source's quiet
	// longest beyond doubt: the Edge orders its connections by when net/http
	// reported each idle, and four made back to back can be reported out of
	// order on a loaded machine.
	for _, c := range held[1:] {
		if err := getHealthz(c, remote); err != nil {
			t.Fatalf("a connection of %s within its share: %v", ip, err)
		}
	}
	// Past the grace, the source's next connection takes the place of
	// its own oldest.
	if _, err := within(20*time.Second, func() error {
		if keptAlive(t, remote) == nil {
			return fmt.Errorf("refused")
		}
		return nil
	}); err != nil {
		t.Fatalf("a new connection from %s once its own were quiet past the grace: %v", ip, err)
	}
	if !closedByPeer(held[0]) {
		t.Errorf("the source's new connection did not take the place of its oldest")
	}
}
