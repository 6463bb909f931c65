package ollamaapi

import (
	"bufio"
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/iop-dev/iop/internal/edge/edgemetrics/metricstest"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// TestStreamReachesClientLineByLine (R3, issue 4): each line reaches the
// client as the provider flushed it; the second is not produced until the
// client has read the first, so a relay that buffered would hang here.
func TestStreamReachesClientLineByLine(t *testing.T) {
	gate := make(chan struct{})
	f := &ft.Dispatcher{Pieces: []ft.Step{ft.Line(`{"message":{"content":"Hel"},"done":false}`),
		ft.Gated(gate, ft.Line(`{"message":{"content":"lo"},"done":false}`)), ft.Line(`{"done":true,"done_reason":"stop"}`)}}
	e := newEnv(t, f)
	srv := httptest.NewServer(e.handler)
	defer srv.Close()
	r, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/api/chat", strings.NewReader(chatBody))
	r.Header.Set("Authorization", "Bearer "+testKey)
	// Should the first line be held back, the gate opens by itself after a
	// while, so that the test fails instead of hanging.
	held := time.AfterFunc(5*time.Second, func() { close(gate) })
	res, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d, content type %q", res.StatusCode, res.Header.Get("Content-Type"))
	}
	rd := bufio.NewReader(res.Body)
	first, err := rd.ReadString('\n')
	if err != nil || first != `{"message":{"content":"Hel"},"done":false}`+"\n" {
		t.Fatalf("first line %q, %v", first, err)
	}
	if !held.Stop() {
		t.Fatal("the first line reached the client only after the second was produced")
	}
	close(gate)
	var rest bytes.Buffer
	if _, err := rest.ReadFrom(rd); err != nil {
		t.Fatal(err)
	}
	if want := `{"message":{"content":"lo"},"done":false}` + "\n" + `{"done":true,"done_reason":"stop"}` + "\n"; rest.String() != want {
		t.Errorf("rest %q, want %q", rest.String(), want)
	}
	srv.Close() // waits for the handler
	if e.requests(t, routeChat, "ok") != 1 || e.ttftCount(t, routeChat) != 1 || e.activeTunnels(t) != 0 {
		t.Errorf("requests ok %v, ttft %v, active %v", e.requests(t, routeChat, "ok"), e.ttftCount(t, routeChat), e.activeTunnels(t))
	}
}

// TestRequestGoesToProviderWithoutClientKey: method, path and query and
// body travel as sent, routed by the body's model; hop-by-hop headers and
// the client's key to the Edge do not, nor the client's Content-Length:
// the gateway sets the length of the body it sends (which an alias route
// rewrites).
func TestRequestGoesToProviderWithoutClientKey(t *testing.T) {
	f := &ft.Dispatcher{Pieces: []ft.Step{ft.Line(`{}`)}}
	e := newEnv(t, f)
	r := req(http.MethodPost, "/api/generate?x=1&y=%20", `{"model":"llama3.2","prompt":"hi"}`)
	r.Header.Set("X-Api-Key", testKey)
	r.Header.Set("Cookie", "session=1")
	r.Header.Set("Connection", "keep-alive, X-Hop")
	r.Header.Set("X-Hop", "1")
	r.Header.Set("Keep-Alive", "timeout=5")
	r.Header.Set("Accept-Encoding", "gzip")
	r.Header.Set("User-Agent", "ollama/0.17.4")
	r.Header.Set("Content-Length", "999")
	if w := e.do(r); w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	s := f.Start(t)
	if s.Model != "llama3.2" || string(s.Body) != `{"model":"llama3.2","prompt":"hi"}` {
		t.Errorf("model %q, body %q", s.Model, s.Body)
	}
	if s.Req.GetMethod() != "POST" || s.Req.GetPath() != "/api/generate?x=1&y=%20" {
		t.Errorf("method %q path %q", s.Req.GetMethod(), s.Req.GetPath())
	}
	got := map[string]string{}
	for _, h := range s.Req.GetHeaders() {
		if _, dup := got[h.GetName()]; dup {
			t.Errorf("header %s twice", h.GetName())
		}
		got[h.GetName()] = h.GetValue()
	}
	want := map[string]string{"Content-Type": "application/json", "User-Agent": "ollama/0.17.4"}
	if len(got) != len(want) {
		t.Errorf("headers %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %s = %q, want %q", k, got[k], v)
		}
	}
}

// TestShowIsRoutedByNameToo: /api/show takes Ollama's deprecated "name"
// when there is no "model"; the other endpoints do not.
func TestShowIsRoutedByNameToo(t *testing.T) {
	f := &ft.Dispatcher{Pieces: []ft.Step{{Data: `{"modelfile":""}`}}}
	e := newEnv(t, f)
	if w := e.do(req(http.MethodPost, "/api/show", `{"name":"qwen3:8b"}`)); w.Code != 200 || w.Body.String() != `{"modelfile":""}` {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if m := f.Start(t).Model; m != "qwen3:8b" {
		t.Errorf("model %q", m)
	}
	w := e.do(req(http.MethodPost, "/api/chat", `{"name":"qwen3:8b"}`))
	if w.Code != 400 || errorTextOf(t, w.Body.String()) != "model is required" {
		t.Errorf("chat by name: %d %s", w.Code, w.Body)
	}
}

// TestResponseHeadIsRelayedWithoutHopByHop: the provider's status and
// headers pass, minus hop-by-hop headers and Content-Length (the body is
// relayed as it comes, and an error line may follow it).
func TestResponseHeadIsRelayedWithoutHopByHop(t *testing.T) {
	f := &ft.Dispatcher{Head: &wirepb.TunnelResponseHead{Status: 404, Headers: []*wirepb.Header{
		{Name: "content-type", Value: "application/json; charset=utf-8"}, {Name: "Content-Length", Value: "53"},
		{Name: "Connection", Value: "X-Hop"}, {Name: "X-Hop", Value: "1"}, {Name: "Transfer-Encoding", Value: "chunked"},
		{Name: "X-Provider", Value: "a"}, {Name: "X-Provider", Value: "b"},
	}}, Pieces: []ft.Step{{Data: `{"error":"model \"x\" not found, try pulling it first"}`}}}
	e := newEnv(t, f)
	w := e.do(req(http.MethodPost, "/api/chat", `{"model":"x"}`))
	if w.Code != 404 || w.Body.String() != `{"error":"model \"x\" not found, try pulling it first"}` {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	h := w.Result().Header
	if h.Get("Content-Type") != "application/json; charset=utf-8" || strings.Join(h.Values("X-Provider"), ",") != "a,b" {
		t.Errorf("headers %v", h)
	}
	for _, name := range []string{"Content-Length", "Connection", "X-Hop", "Transfer-Encoding"} {
		if v, ok := h[name]; ok {
			t.Errorf("%s relayed: %v", name, v)
		}
	}
	if e.requests(t, routeChat, "provider_error") != 1 {
		t.Error("a provider's error status is not counted as provider_error")
	}
}

// TestCompletedWithoutBodyRelaysHead: a head and a completed terminal with
// no body is the provider's empty answer, relayed.
func TestCompletedWithoutBodyRelaysHead(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{Head: &wirepb.TunnelResponseHead{Status: 200}})
	if w := e.do(req(http.MethodPost, "/api/chat", chatBody)); w.Code != 200 || w.Body.Len() != 0 {
		t.Fatalf("status %d: %q", w.Code, w.Body)
	}
}

// TestErrorLineAfterOutput (issue 4: never a silent end): once output has
// started, a tunnel that ends any way but completed gets one more line,
// {"error": ...}, on a line of its own, and nothing after it.
func TestErrorLineAfterOutput(t *testing.T) {
	const (
		failed   = wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED
		upstream = wirepb.FailureKind_FAILURE_KIND_UPSTREAM
	)
	tests := []struct {
		name    string
		end     error
		partial bool // the body stopped mid-line
		want    string
		outcome string
	}{
		{"failed", ft.TunnelEnd(failed, upstream, "ollama crashed"), false, "the provider failed: ollama crashed", "upstream"},
		{"failed mid-line", ft.TunnelEnd(failed, upstream, "ollama crashed"), true, "the provider failed: ollama crashed", "upstream"},
		{"disconnected", ft.TunnelEnd(wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED, wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, "node lost"), false,
			"the Node running the request was lost: node lost", "node_disconnected"},
		{"stalled", ft.TunnelEnd(wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED, 0, ""), false,
			ft.StallText, "response_stalled"},
		{"deadline", ft.TunnelEnd(wirepb.TunnelOutcome_TUNNEL_OUTCOME_DEADLINE_EXCEEDED, 0, ""), false,
			"the request did not finish within its deadline", "deadline_exceeded"},
		{"cancelled by the node", ft.TunnelEnd(wirepb.TunnelOutcome_TUNNEL_OUTCOME_CANCELLED, 0, "shutting down"), false,
			"the request was cancelled: shutting down", "cancelled"},
		{"protocol", ft.TunnelEnd(failed, wirepb.FailureKind_FAILURE_KIND_PROTOCOL, "frame after the terminal"), false,
			"the provider failed: frame after the terminal", "protocol"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first := ft.Line(`{"message":{"content":"Hel"},"done":false}`)
			if tt.partial {
				first.Data = `{"message":{"con`
			}
			e := newEnv(t, &ft.Dispatcher{Pieces: []ft.Step{first}, End: tt.end})
			w := e.do(req(http.MethodPost, "/api/chat", chatBody))
			if w.Code != 200 {
				t.Fatalf("status %d", w.Code)
			}
			body, ok := strings.CutPrefix(w.Body.String(), first.Data)
			if !ok {
				t.Fatalf("body %q does not start with the output", w.Body)
			}
			if tt.partial {
				body, ok = strings.CutPrefix(body, "\n")
				if !ok {
					t.Fatalf("the error line does not start a line: %q", w.Body)
				}
			}
			last, ok := strings.CutSuffix(body, "\n")
			if !ok || strings.Contains(last, "\n") {
				t.Fatalf("not one line after the output: %q", body)
			}
			if got := errorTextOf(t, last); got != tt.want {
				t.Errorf("error %q, want %q", got, tt.want)
			}
			if e.requests(t, routeChat, tt.outcome) != 1 {
				t.Errorf("outcome %q not counted", tt.outcome)
			}
		})
	}
}

// TestHTTPErrorBeforeOutput: a tunnel that ends before its first body byte
// is answered with an HTTP status fitting the terminal, in Ollama's shape,
// instead of the head it had sent.
func TestHTTPErrorBeforeOutput(t *testing.T) {
	tests := []struct {
		name   string
		end    error
		status int
		msg    string
	}{
		{"model not found", ft.TunnelEnd(wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND, "no m1"),
			404, "the provider does not have the model: no m1"},
		{"rate limited", ft.TunnelEnd(wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, wirepb.FailureKind_FAILURE_KIND_RATE_LIMITED, ""),
			429, "the provider is rate limited"},
		{"upstream", ft.TunnelEnd(wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, wirepb.FailureKind_FAILURE_KIND_UPSTREAM, "boom"),
			502, "the provider failed: boom"},
		{"unavailable", ft.TunnelEnd(wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, "down"),
			503, "the provider is unavailable: down"},
		{"stalled in prefill", ft.TunnelEnd(wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED, 0, ""),
			504, ft.StallText},
		{"deadline", ft.TunnelEnd(wirepb.TunnelOutcome_TUNNEL_OUTCOME_DEADLINE_EXCEEDED, 0, ""),
			504, "the request did not finish within its deadline"},
		{"disconnected", ft.TunnelEnd(wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED, 0, ""),
			502, "the Node running the request was lost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, &ft.Dispatcher{End: tt.end})
			w := e.do(req(http.MethodPost, "/api/generate", `{"model":"m1","prompt":"hi"}`))
			if w.Code != tt.status || w.Header().Get("Content-Type") != "application/json; charset=utf-8" {
				t.Fatalf("status %d, content type %q, want %d", w.Code, w.Header().Get("Content-Type"), tt.status)
			}
			if got := errorTextOf(t, w.Body.String()); got != tt.msg {
				t.Errorf("error %q, want %q", got, tt.msg)
			}
			if tt.status == http.StatusGatewayTimeout && tt.msg == ft.StallText && w.Header().Get(frontend.LivenessHeader) != "request_stalled" {
				t.Errorf("%s = %q, want request_stalled", frontend.LivenessHeader, w.Header().Get(frontend.LivenessHeader))
			}
			if e.ttftCount(t, routeGenerate) != 0 {
				t.Error("a time to first token was observed without output")
			}
		})
	}
}

// TestInvalidProviderStatusIsAnError: a head whose status cannot be
// relayed is a 502, not a panic in WriteHeader.
func TestInvalidProviderStatusIsAnError(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{Head: &wirepb.TunnelResponseHead{Status: 42}, Pieces: []ft.Step{ft.Line("{}")}})
	w := e.do(req(http.MethodPost, "/api/chat", chatBody))
	if w.Code != 502 || !strings.Contains(errorTextOf(t, w.Body.String()), "invalid status 42") {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
}

// TestRequestsRefusedBeforeTheTunnel: what is wrong with the request
// itself is answered in Ollama's shape without starting a tunnel.
func TestRequestsRefusedBeforeTheTunnel(t *testing.T) {
	big := `{"model":"m1","prompt":"` + strings.Repeat("x", frontdoor.DefaultMaxRequest) + `"}`
	tests := []struct {
		name   string
		r      *http.Request
		status int
		msg    string
	}{
		{"no model", req(http.MethodPost, "/api/chat", `{"messages":[]}`), 400, "model is required"},
		{"empty body", req(http.MethodPost, "/api/embed", ``), 400, "missing request body"},
		{"not JSON", req(http.MethodPost, "/api/embed", `{"model":`), 400, "unexpected end of JSON input"},
		{"too large", req(http.MethodPost, "/api/generate", big), 413, "the request body is larger than the limit of 33554432 bytes (limits.max_request_mib)"},
		{"no key", httptest.NewRequest(http.MethodPost, "/api/chat", strings.NewReader(chatBody)), 401,
			`missing API key: send it as "Authorization: Bearer KEY" or "x-api-key: KEY"`},
		{"forbidden model", req(http.MethodPost, "/api/chat", `{"model":"secret"}`), 404, `model 'secret' not found`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &ft.Dispatcher{Forbidden: []string{"secret"}}
			e := newEnv(t, f)
			w := e.do(tt.r)
			if w.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.status, w.Body)
			}
			if got := errorTextOf(t, w.Body.String()); got != tt.msg {
				t.Errorf("error %q, want %q", got, tt.msg)
			}
			if tt.status == http.StatusGatewayTimeout && tt.msg == ft.StallText && w.Header().Get(frontend.LivenessHeader) != "request_stalled" {
				t.Errorf("%s = %q, want request_stalled", frontend.LivenessHeader, w.Header().Get(frontend.LivenessHeader))
			}
			if len(f.Starts()) != 0 {
				t.Error("a tunnel was started")
			}
		})
	}
}

// TestRoutingAnswersInOllamaShape: unknown paths are 404 and wrong methods
// 405, both {"error": ...}; GET and HEAD / say Ollama is running, without
// a key, since the ollama CLI probes it first.
func TestRoutingAnswersInOllamaShape(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{})
	w := e.do(req(http.MethodPost, "/api/pull", `{"model":"m1"}`))
	if w.Code != 404 || errorTextOf(t, w.Body.String()) != "unknown request URL: POST /api/pull" {
		t.Errorf("unknown: %d %s", w.Code, w.Body)
	}
	w = e.do(req(http.MethodGet, "/api/chat", ""))
	if w.Code != 405 || w.Header().Get("Allow") != "POST" || !strings.Contains(errorTextOf(t, w.Body.String()), "use POST") {
		t.Errorf("wrong method: %d %v %s", w.Code, w.Header(), w.Body)
	}
	w = e.do(req(http.MethodPost, "/api/tags", ""))
	if w.Code != 405 || w.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("wrong method on a GET endpoint: %d %v", w.Code, w.Header())
	}
	for _, m := range []string{http.MethodGet, http.MethodHead} {
		w = e.do(httptest.NewRequest(m, "/", nil))
		if w.Code != 200 || w.Header().Get("Content-Type") != "text/plain; charset=utf-8" || w.Body.String() != "Ollama is running" {
			t.Errorf("%s /: %d %q", m, w.Code, w.Body)
		}
	}
	if w = e.do(httptest.NewRequest(http.MethodPost, "/", nil)); w.Code != 405 {
		t.Errorf("POST /: %d", w.Code)
	}
}

// TestEveryReadIsFlushed: each body read of the tunnel is flushed to the
// client at once, not left in the server's write buffer.
func TestEveryReadIsFlushed(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{Pieces: []ft.Step{ft.Line("a"), ft.Line("b"), ft.Line(`{"done":true}`)}})
	w := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
	e.handler.ServeHTTP(w, req(http.MethodPost, "/api/chat", chatBody))
	if w.flushes != 3 || w.Body.String() != "a\nb\n{\"done\":true}\n" {
		t.Errorf("%d flushes for %q", w.flushes, w.Body)
	}
}

// flushCounter counts flushes.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes int
}

func (f *flushCounter) Flush() { f.flushes++; f.ResponseRecorder.Flush() }

// A streamed answer's tokens, from its final line, are counted once it
// completed; the request is counted by its model and principal. An answer
// cut short has no final line and counts no tokens.
func TestTunnelCountsTheFinalLinesTokens(t *testing.T) {
	f := &ft.Dispatcher{Pieces: []ft.Step{ft.Line(`{"message":{"content":"Hi"},"done":false}`),
		ft.Line(`{"done":true,"done_reason":"stop","prompt_eval_count":11,"eval_count":2}`)}}
	e := newEnv(t, f)
	if w := e.do(req(http.MethodPost, "/api/chat", chatBody)); w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if got := f.Tunnel(t).Counted(); len(got) != 1 || got[0] != [2]int64{11, 2} {
		t.Errorf("CountUsage calls %v, want one with 11 prompt and 2 completion tokens", got)
	}
	if got := metricstest.Sum(t, e.metrics.Requests, "route", routeChat, "model", "m1", "principal", "tester", "outcome", "ok"); got != 1 {
		t.Errorf("requests by route, model, principal and outcome: %v, want 1", got)
	}

	cut := &ft.Dispatcher{Pieces: []ft.Step{ft.Line(`{"message":{"content":"Hi"},"done":false}`)}}
	e = newEnv(t, cut)
	e.do(req(http.MethodPost, "/api/chat", chatBody))
	if got := cut.Tunnel(t).Counted(); len(got) != 0 {
		t.Errorf("an answer without its final line counted tokens: %v", got)
	}
}
