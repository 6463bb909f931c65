package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// Issue 16, "TLS and trust for clients" and "config changes without a restart": the real
// edged and noded, with a fake Ollama behind the Node, and real clients over loopback.

// clientStack is an edged (loopback identity) whose config is head (listen and identity are
// added) and one noded whose Ollama provider is fake.
type clientStack struct {
	dir, conf string
	httpPort  int
	quicPort  int
	edge      *proc
}

func startClientStack(t *testing.T, fake *fakeollama.Server, head func(s *clientStack) string) *clientStack {
	t.Helper()
	s := &clientStack{dir: t.TempDir(), httpPort: freePort(t, "tcp"), quicPort: freePort(t, "udp")}
	s.conf = filepath.Join(s.dir, "edge.yaml")
	s.write(t, head(s))
	s.edge = start(t, "edged", bin.edged, "run", "--config", s.conf)
	nodeConf := filepath.Join(s.dir, "node.yaml")
	writeFile(t, nodeConf, fmt.Sprintf(`
node_id: n1
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
providers: [{name: ollama, adapter: ollama, capacity: 2, config: {base_url: %q}}]
`, s.quicPort, fake.URL()))
	start(t, "noded", bin.noded, "run", "--config", nodeConf)
	return s
}

// write replaces the Edge's config file with body, after its listen and identity sections.
func (s *clientStack) write(t *testing.T, body string) {
	t.Helper()
	tmp := s.conf + ".tmp"
	writeFile(t, tmp, fmt.Sprintf("listen: {quic: \"127.0.0.1:%d\", http: \"127.0.0.1:%d\"}\nidentity: {mode: loopback}\n%s", s.quicPort, s.httpPort, body))
	if err := os.Rename(tmp, s.conf); err != nil {
		t.Fatal(err)
	}
}

// waitReady polls /admin/v1/nodes with c (and key, if any) until n1 is ready with its provider.
func waitReady(t *testing.T, c *http.Client, base, key string) {
	t.Helper()
	waitFor(t, "n1 ready", func() bool {
		req, _ := http.NewRequest(http.MethodGet, base+"/admin/v1/nodes", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := c.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body struct{ Nodes []nodeView }
		if json.NewDecoder(resp.Body).Decode(&body) != nil {
			return false
		}
		return len(body.Nodes) == 1 && body.Nodes[0].State == "ready" && len(body.Nodes[0].Providers) == 1 &&
			body.Nodes[0].Providers[0].State == "online"
	})
}

// testCA is a CA made by the test, for the client listener's certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "iop test client CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue writes a server certificate for 127.0.0.1 with serial, and its key, each file
// replaced by a rename, as certificate tools do.
func (ca *testCA) issue(t *testing.T, certFile, keyFile string, serial int64) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "edge"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		name string
		data []byte
	}{
		{keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})},
		{certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})},
	} {
		writeFile(t, f.name+".new", string(f.data))
		if err := os.Rename(f.name+".new", f.name); err != nil {
			t.Fatal(err)
		}
	}
}

// tlsClient trusts pool; http2 says whether it offers HTTP/2 (otherwise HTTP/1.1 only). It
// opens a new connection for every request, so each sees the certificate served now.
func tlsClient(pool *x509.CertPool, http2 bool) *http.Client {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: http2, DisableKeepAlives: true}
	if !http2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// Issue 16: the client listener serves TLS from a certificate and key on disk, HTTP/2 and
// HTTP/1.1; the OpenAI SDK with the CA in its pool chats over it; a plain HTTP request gets a
// clear 400; a certificate rotated on disk is served without a restart.
func TestClientListenerServesTLSAndTakesARotatedCertificate(t *testing.T) {
	fake := fakeollama.New(fakeollama.Model{Name: "tiny:latest", Text: "hello over tls"})
	defer fake.Close()
	ca := newTestCA(t)
	var certFile, keyFile string
	s := startClientStack(t, fake, func(s *clientStack) string {
		certFile, keyFile = filepath.Join(s.dir, "api.crt"), filepath.Join(s.dir, "api.key")
		ca.issue(t, certFile, keyFile, 100)
		return "api: {tls: {cert_file: api.crt, key_file: api.key}}\n"
	})
	base := fmt.Sprintf("https://127.0.0.1:%d", s.httpPort)
	s.edge.waitOutput(regexp.MustCompile(`serving https`))
	h2 := tlsClient(ca.pool, true)
	waitReady(t, h2, base, "")

	// The OpenAI SDK, over HTTP/2.
	var resp *http.Response
	c := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithHTTPClient(h2))
	out, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatalf("chat over TLS: %v", err)
	}
	if out.Choices[0].Message.Content != "hello over tls" {
		t.Errorf("answer %q", out.Choices[0].Message.Content)
	}
	if resp.Proto != "HTTP/2.0" || resp.TLS == nil || resp.TLS.NegotiatedProtocol != "h2" {
		t.Errorf("the SDK's response came over %s (TLS %v), want HTTP/2.0 over TLS with ALPN h2", resp.Proto, resp.TLS != nil)
	}
	// A streamed answer over HTTP/2 too.
	stream := c.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{Model: "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	var streamed strings.Builder
	for stream.Next() {
		if ch := stream.Current(); len(ch.Choices) > 0 {
			streamed.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil || streamed.String() != "hello over tls" {
		t.Errorf("stream over TLS: %q, %v", streamed.String(), err)
	}

	// HTTP/1.1 over TLS.
	r11, err := tlsClient(ca.pool, false).Get(base + "/v1/models")
	if err != nil {
		t.Fatalf("HTTP/1.1 over TLS: %v", err)
	}
	io.Copy(io.Discard, r11.Body)
	r11.Body.Close()
	if r11.StatusCode != http.StatusOK || r11.Proto != "HTTP/1.1" {
		t.Errorf("HTTP/1.1 client: %s over %s", r11.Status, r11.Proto)
	}

	// Plain HTTP to the TLS port: Go's server answers it, clearly.
	plain, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/v1/models", s.httpPort))
	if err != nil {
		t.Fatalf("plain HTTP to the TLS port: %v", err)
	}
	body, _ := io.ReadAll(plain.Body)
	plain.Body.Close()
	if plain.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "Client sent an HTTP request to an HTTPS server") {
		t.Errorf("plain HTTP to the TLS port: %s %q; want 400 saying it is an HTTPS server", plain.Status, body)
	}

	// A client that does not trust the CA is refused by its own TLS check.
	if _, err := tlsClient(x509.NewCertPool(), true).Get(base + "/healthz"); err == nil {
		t.Error("a client without the CA connected")
	}

	// The container health check, over TLS on the Edge's own host.
	ready := fmt.Sprintf("https://127.0.0.1:%d/readyz", s.httpPort)
	if out, err := run(t, s.dir, bin.edged, "healthcheck", "--url", ready, "--insecure"); err != nil {
		t.Errorf("edged healthcheck --insecure over TLS: %v\n%s", err, out)
	}
	if out, err := run(t, s.dir, bin.edged, "healthcheck", "--url", ready); err == nil {
		t.Errorf("edged healthcheck trusted a certificate of an unknown CA:\n%s", out)
	}

	// Rotation: the new certificate is served without a restart.
	serial := func() int64 {
		r, err := h2.Get(base + "/healthz")
		if err != nil {
			return 0
		}
		r.Body.Close()
		return r.TLS.PeerCertificates[0].SerialNumber.Int64()
	}
	if got := serial(); got != 100 {
		t.Fatalf("serial before the rotation %d, want 100", got)
	}
	ca.issue(t, certFile, keyFile, 101)
	waitFor(t, "the rotated certificate (serial 101) to be served", func() bool { return serial() == 101 })
	s.edge.waitOutput(regexp.MustCompile(`certificate reloaded.*serial=101`))
	if out, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}); err != nil || out.Choices[0].Message.Content != "hello over tls" {
		t.Errorf("chat after the rotation: %v", err)
	}
}

// fromAddr is an HTTP client whose connections leave from the local address ip.
func fromAddr(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}, Timeout: 30 * time.Second}
}

// Issue 16: a client from a trusted network without a key is served as the network's
// principal, with its routes; from elsewhere it gets 401; a key still decides when given.
// Anonymous access is off because keys are configured, so of all of 127.0.0.0/8 only the
// trusted 127.0.0.2 gets in without a key.
func TestTrustedNetworkClientNeedsNoKeyAndOthersDo(t *testing.T) {
	fake := fakeollama.New(fakeollama.Model{Name: "tiny:latest", Text: "hello lan"}, fakeollama.Model{Name: "other:latest", Text: "not for the lan"})
	defer fake.Close()
	const adminKey = "sk-admin-trusted-0001"
	s := startClientStack(t, fake, func(*clientStack) string {
		return fmt.Sprintf(`
api:
  keys: [{principal: ops, sha256: %s}]
  trusted_networks: [{cidr: 127.0.0.2/32, principal: lan}]
principals:
  - {name: ops, routes: ['*'], admin: true}
  - {name: lan, routes: [tiny]}
routes: [{name: tiny, model: tiny}, {name: other, model: other}]
`, auth.HashKey(adminKey))
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", s.httpPort)
	waitReady(t, http.DefaultClient, base, adminKey)

	chat := func(c *http.Client, path, key, model string) (int, string) {
		body := fmt.Sprintf(`{"model":%q,"stream":false,"messages":[{"role":"user","content":"hi"}]}`, model)
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	lan, elsewhere := fromAddr("127.0.0.2"), fromAddr("127.0.0.3")
	for _, path := range []string{"/v1/chat/completions", "/api/chat"} {
		if code, body := chat(lan, path, "", "tiny"); code != http.StatusOK || !strings.Contains(body, "hello lan") {
			t.Errorf("%s from the trusted 127.0.0.2 without a key: %d %s", path, code, body)
		}
		if code, body := chat(lan, path, "", "other"); code != http.StatusForbidden && code != http.StatusNotFound {
			t.Errorf("%s from the trusted network to a route its principal may not use: %d %s; want refused", path, code, body)
		}
		if code, body := chat(elsewhere, path, "", "tiny"); code != http.StatusUnauthorized {
			t.Errorf("%s from 127.0.0.3 without a key: %d %s; want 401", path, code, body)
		}
		if code, body := chat(lan, path, "sk-wrong", "tiny"); code != http.StatusUnauthorized {
			t.Errorf("%s from the trusted network with a wrong key: %d %s; want 401 (a key decides)", path, code, body)
		}
		if code, body := chat(elsewhere, path, adminKey, "other"); code != http.StatusOK || !strings.Contains(body, "not for the lan") {
			t.Errorf("%s from 127.0.0.3 with a key: %d %s", path, code, body)
		}
	}
	// The Ollama CLI's model list, from the LAN: what its principal may use.
	resp, err := lan.Get(base + "/api/tags")
	if err != nil {
		t.Fatal(err)
	}
	tags, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(tags), "tiny") || strings.Contains(string(tags), "other") {
		t.Errorf("/api/tags from the LAN: %d %s; want tiny only", resp.StatusCode, tags)
	}
	// The trusted network is not an admin: reload refused.
	req, _ := http.NewRequest(http.MethodPost, base+"/admin/v1/reload", nil)
	resp, err = lan.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("reload from the trusted network: %s; want 403", resp.Status)
	}
}

// reloadEdge asks the Edge to reload with key and returns the status and the answer.
func reloadEdge(t *testing.T, base, key string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/admin/v1/reload", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("reload answer: %v", err)
	}
	return resp.StatusCode, body
}

// Issue 16: configuration changes without a restart. SIGHUP adds a key; the admin endpoint
// moves a route to another target and profile while a stream runs on it (the stream finishes
// on its old route and profile, the next request takes the new one); an invalid file is
// refused and the old configuration keeps serving; a change that needs a restart is named.
func TestConfigReloadsWithoutARestart(t *testing.T) {
	old := fakeollama.Model{Name: "old:latest", Text: strings.TrimSpace(strings.Repeat("old ", 40)), TokenDelay: 75 * time.Millisecond}
	fake := fakeollama.New(old, fakeollama.Model{Name: "new:latest", Text: "new answer"})
	defer fake.Close()
	const opsKey, bobKey = "sk-ops-reload-0001", "sk-bob-reload-0002"
	file := func(keys, route string) string {
		return fmt.Sprintf(`
api:
  keys: [%s]
principals: [{name: ops, routes: ['*'], admin: true}, {name: bob, routes: [chat]}]
profiles: [{name: tight, deadline: 2s}]
routes: [%s]
`, keys, route)
	}
	opsOnly := fmt.Sprintf("{principal: ops, sha256: %s}", auth.HashKey(opsKey))
	both := opsOnly + fmt.Sprintf(", {principal: bob, sha256: %s}", auth.HashKey(bobKey))
	oldRoute := "{name: chat, model: chat, targets: [{target: 'old:latest'}]}"
	newRoute := "{name: chat, model: chat, profile: tight, targets: [{target: 'new:latest'}]}"
	s := startClientStack(t, fake, func(*clientStack) string { return file(opsOnly, oldRoute) })
	base := fmt.Sprintf("http://127.0.0.1:%d", s.httpPort)
	waitReady(t, http.DefaultClient, base, opsKey)
	client := func(key string) openai.Client {
		return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
	}
	ask := func(key string) (string, error) {
		c := client(key)
		out, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "chat",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		if err != nil {
			return "", err
		}
		return out.Choices[0].Message.Content, nil
	}

	// A key added by SIGHUP.
	if _, err := ask(bobKey); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("bob before the reload: %v; want 401", err)
	}
	s.write(t, file(both, oldRoute))
	if err := s.edge.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	s.edge.waitOutput(regexp.MustCompile(`config reloaded.*by=SIGHUP.*api\.keys: 1 -> 2`))
	if got, err := ask(bobKey); err != nil || got != old.Text {
		t.Errorf("bob after SIGHUP: %q, %v", got, err)
	}

	// A route changed under a running stream.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	bob := client(bobKey)
	stream := bob.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "chat",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	var streamed strings.Builder
	var finish string
	read := func() bool {
		if !stream.Next() {
			return false
		}
		if ch := stream.Current(); len(ch.Choices) > 0 {
			streamed.WriteString(ch.Choices[0].Delta.Content)
			if ch.Choices[0].FinishReason != "" {
				finish = ch.Choices[0].FinishReason
			}
		}
		return true
	}
	began := time.Now()
	for streamed.Len() == 0 && read() {
	}
	if streamed.Len() == 0 {
		t.Fatalf("the stream gave nothing: %v", stream.Err())
	}
	s.write(t, file(both, newRoute))
	code, answer := reloadEdge(t, base, opsKey)
	if code != http.StatusOK || answer["applied"] != true || !strings.Contains(fmt.Sprint(answer["changes"]), "routes: ~chat") {
		t.Fatalf("reload of the route: %d %v", code, answer)
	}
	if got, err := ask(bobKey); err != nil || got != "new answer" {
		t.Errorf("the next request after the route changed: %q, %v; want the new target's answer", got, err)
	}
	for read() {
	}
	if err := stream.Err(); err != nil || streamed.String() != old.Text || finish != "stop" {
		t.Errorf("the stream across the reload: %q (finish %q), %v; want the old route's whole answer", streamed.String(), finish, err)
	}
	// The stream outlived the new profile's 2s deadline: it kept its own profile.
	if d := time.Since(began); d < 2*time.Second {
		t.Errorf("the stream took %v; it must outlast the new profile's 2s deadline for this test to show it kept its own", d)
	}

	// An invalid file is refused, by the endpoint and by SIGHUP, and the old config serves on.
	s.write(t, file(both, "{name: chat, model: chat, profile: nowhere}"))
	code, answer = reloadEdge(t, base, opsKey)
	if code != http.StatusUnprocessableEntity || answer["applied"] != false || !strings.Contains(fmt.Sprint(answer["error"]), `unknown profile "nowhere"`) {
		t.Errorf("an invalid reload: %d %v; want 422 naming the unknown profile", code, answer)
	}
	if err := s.edge.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	s.edge.waitOutput(regexp.MustCompile(`config reload refused.*by=SIGHUP`))
	if got, err := ask(bobKey); err != nil || got != "new answer" {
		t.Errorf("after the refused reloads: %q, %v; want the running config still serving", got, err)
	}
	if !strings.Contains(metricsText(t, base, opsKey), `iop_edge_config_reloads_total{result="refused"} 2`) {
		t.Error("the refused reloads are not counted")
	}

	// A change only a restart applies is named and not applied.
	s.write(t, "limits: {max_connections: 10}\n"+file(both, newRoute))
	code, answer = reloadEdge(t, base, opsKey)
	if code != http.StatusOK || fmt.Sprint(answer["restart_required"]) != "[limits]" {
		t.Errorf("a reload changing limits: %d %v; want applied, with limits named as needing a restart", code, answer)
	}
	s.edge.waitOutput(regexp.MustCompile(`take effect only at a restart.*limits`))
	if m := metricsText(t, base, opsKey); !strings.Contains(m, `iop_edge_config_reloads_total{result="applied"} 3`) {
		t.Errorf("applied reloads not counted 3:\n%s", grepLines(m, "config_reloads"))
	}
}

func metricsText(t *testing.T, base, key string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
