package ollamaapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/edgemetrics"
	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

const adminKey = "sk-admin-0123456789"

// manageAuth accepts testKey (tester, not an admin) and adminKey (ops, an
// admin).
func manageAuth(t testing.TB) *auth.Authenticator {
	t.Helper()
	return keysAuth(t, []edgeconfig.Principal{{Name: "tester", Routes: []string{edgeconfig.AllRoutes}},
		{Name: "ops", Routes: []string{edgeconfig.AllRoutes}, Admin: true}},
		[]edgeconfig.APIKey{{Principal: "tester", SHA256: auth.HashKey(testKey)}, {Principal: "ops", SHA256: auth.HashKey(adminKey)}})
}

// fakeServer is how one Node's provider answers a management tunnel: its
// status and body, then how its stream ends (nil: completed); hang, after
// the body, until the call is cancelled.
type fakeServer struct {
	status int32
	body   string
	end    error
	hang   bool
}

// sentCall is one management tunnel the fake manager was asked to open.
type sentCall struct {
	node, provider string
	req            *wirepb.TunnelRequest
	body           map[string]any
}

// fakeManager is the dispatcher's side of model management: its Nodes,
// and each provider's answer by "node/provider".
type fakeManager struct {
	nodes   []dispatch.ManagedNode
	servers map[string]fakeServer

	mu    sync.Mutex
	calls []sentCall
}

func (m *fakeManager) ManagedNodes(adapter string) []dispatch.ManagedNode {
	if adapter != Adapter {
		return nil
	}
	return m.nodes
}

func (m *fakeManager) Manage(ctx context.Context, nodeID, provider string, req *wirepb.TunnelRequest, body []byte) (dispatch.TunnelStream, error) {
	var b map[string]any
	_ = json.Unmarshal(body, &b)
	m.mu.Lock()
	m.calls = append(m.calls, sentCall{node: nodeID, provider: provider, req: req, body: b})
	m.mu.Unlock()
	s := m.servers[nodeID+"/"+provider]
	fs := &fakeStream{head: &wirepb.TunnelResponseHead{Status: s.status}, r: strings.NewReader(s.body), end: s.end}
	if s.hang {
		fs.r = io.MultiReader(fs.r, ctxReader{ctx})
	}
	return fs, nil
}

// ctxReader blocks until ctx is done, as a tunnel whose server is silent
// does until it is cancelled.
type ctxReader struct{ ctx context.Context }

func (r ctxReader) Read([]byte) (int, error) {
	<-r.ctx.Done()
	return 0, context.Cause(r.ctx)
}

func (m *fakeManager) sent() []sentCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := slices.Clone(m.calls)
	slices.SortFunc(out, func(a, b sentCall) int { return strings.Compare(a.node+a.provider, b.node+b.provider) })
	return out
}

// fakeStream is a management tunnel's answer.
type fakeStream struct {
	head *wirepb.TunnelResponseHead
	r    io.Reader
	end  error
}

func (s *fakeStream) Abandon(error) bool                        { return false }
func (s *fakeStream) Abandoned() bool                           { return false }
func (s *fakeStream) Head() (*wirepb.TunnelResponseHead, error) { return s.head, nil }
func (s *fakeStream) Ready() bool                               { return false }
func (s *fakeStream) Terminal() *wirepb.TunnelTerminal          { return nil }
func (s *fakeStream) Close()                                    {}
func (s *fakeStream) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err == io.EOF && s.end != nil {
		return n, s.end
	}
	return n, err
}
func (s *fakeStream) NextPiece() ([]byte, error) {
	p := make([]byte, 4<<10)
	n, err := s.Read(p)
	return p[:n], err
}

// manageEnv serves the API with management over m.
func manageEnv(t *testing.T, m *fakeManager) (http.Handler, *edgemetrics.Metrics) {
	t.Helper()
	a := manageAuth(t)
	metrics := edgemetrics.New(nil, nil)
	front := frontend.New(&ft.Dispatcher{}, a, frontend.Options{Metrics: metrics})
	return Handler(front, WithManagement(Management{Auth: a, Manager: m, Metrics: metrics})), metrics
}

func manageReq(method, path, key, body string) *http.Request {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	if key != "" {
		r.Header.Set("Authorization", "Bearer "+key)
	}
	r.Header.Set("Content-Type", "application/json")
	return r
}

// lines decodes an NDJSON body.
func lines(t *testing.T, body string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		var l map[string]any
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("not NDJSON: %q", body)
		}
		out = append(out, l)
	}
	return out
}

func twoNodes() []dispatch.ManagedNode {
	return []dispatch.ManagedNode{
		{ID: "n1", Labels: map[string]string{"gpu": "a"}, Providers: []dispatch.ManagedProvider{{Name: "ollama", Targets: []string{"base:latest"}}}},
		{ID: "n2", Labels: map[string]string{"gpu": "b"}, Providers: []dispatch.ManagedProvider{{Name: "ollama", Targets: []string{"other:latest"}}}},
		{ID: "n3", Unavailable: "suspect: not heard from for a few seconds", Providers: []dispatch.ManagedProvider{{Name: "ollama"}}},
	}
}

const pullOK = `{"status":"pulling manifest"}
{"status":"pulling 6a0746a1ec1a","digest":"sha256:6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa","total":100}
{"status":"pulling 6a0746a1ec1a","digest":"sha256:6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa","total":100,"completed":100}
{"status":"verifying sha256 digest"}
{"status":"writing manifest"}
{"status":"success"}
`

// Issue 23: management is an admin's. A key of another principal is 403
// in Ollama's shape, no key 401; nothing reaches a Node.
func TestManagementIsForAdminsOnly(t *testing.T) {
	m := &fakeManager{nodes: twoNodes()}
	h, metrics := manageEnv(t, m)
	for _, c := range []struct {
		method, path, body string
	}{
		{http.MethodPost, "/api/pull", `{"model":"x"}`},
		{http.MethodDelete, "/api/delete", `{"model":"base"}`},
		{http.MethodPost, "/api/copy", `{"source":"base","destination":"b2"}`},
		{http.MethodPost, "/api/create", `{"model":"y","from":"base"}`},
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, manageReq(c.method, c.path, testKey, c.body))
		if msg := errorTextOf(t, w.Body.String()); w.Code != http.StatusForbidden || !strings.Contains(msg, "admin") || !strings.Contains(msg, `"tester"`) {
			t.Errorf("%s with a user's key: %d %q", c.path, w.Code, msg)
		}
		w = httptest.NewRecorder()
		h.ServeHTTP(w, manageReq(c.method, c.path, "", c.body))
		if w.Code != http.StatusUnauthorized || w.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("%s without a key: %d %v", c.path, w.Code, w.Header())
		}
	}
	if calls := m.sent(); len(calls) != 0 {
		t.Errorf("refused calls reached Nodes: %+v", calls)
	}
	if n := value(t, metrics.Requests.WithLabelValues(routePull, "", "tester", "forbidden")); n != 1 {
		t.Errorf("forbidden pulls counted %v, want 1", n)
	}
	// Without WithManagement the paths are unknown, as before.
	e := newEnv(t, &ft.Dispatcher{})
	if w := e.do(req(http.MethodPost, "/api/pull", `{"model":"x"}`)); w.Code != http.StatusNotFound {
		t.Errorf("pull without management wired: %d", w.Code)
	}
}

// Issue 23: a pull goes to every ready Node, each Node's progress named by
// it (its status prefixed, its digest its own, so the CLI's bars are per
// Node), and ends with an error line naming the Node that failed and its
// reason, and the one that succeeded. Each Node got the client's body as a
// stream, without the Edge's own fields, as a management tunnel.
func TestPullStreamsEveryNodesProgressAndNamesTheFailedOne(t *testing.T) {
	m := &fakeManager{nodes: twoNodes(), servers: map[string]fakeServer{
		"n1/ollama": {status: 200, body: pullOK},
		"n2/ollama": {status: 200, body: `{"status":"pulling manifest"}` + "\n" + `{"error":"pull model manifest: file does not exist"}` + "\n"},
	}}
	h, _ := manageEnv(t, m)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, manageReq(http.MethodPost, "/api/pull", adminKey, `{"model":"llama3.2","insecure":true}`))
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d, content type %q", w.Code, w.Header().Get("Content-Type"))
	}
	ls := lines(t, w.Body.String())
	byNode := map[string][]string{}
	digests := map[string]bool{}
	for _, l := range ls[:len(ls)-1] {
		status, _ := l["status"].(string)
		node, rest, _ := strings.Cut(status, ": ")
		byNode[node] = append(byNode[node], rest)
		if d, ok := l["digest"].(string); ok {
			digests[d] = true
		}
	}
	if got := byNode["n1"]; !slices.Equal(got, []string{"pulling manifest", "pulling 6a0746a1ec1a", "pulling 6a0746a1ec1a", "verifying sha256 digest", "writing manifest", "success"}) {
		t.Errorf("n1's lines %q", got)
	}
	if got := byNode["n2"]; !slices.Equal(got, []string{"pulling manifest", "failed: pull model manifest: file does not exist"}) {
		t.Errorf("n2's lines %q", got)
	}
	if len(digests) != 1 || !digests["n1 6a0746a1ec1a"] {
		t.Errorf("digests %v, want n1's own", digests)
	}
	last := ls[len(ls)-1]
	if msg, _ := last["error"].(string); msg != "pull llama3.2 failed on n2: pull model manifest: file does not exist; succeeded on n1" || len(last) != 1 {
		t.Errorf("last line %v", last)
	}
	calls := m.sent()
	if len(calls) != 2 || calls[0].node != "n1" || calls[1].node != "n2" {
		t.Fatalf("calls %+v: want n1 and n2, not the suspect n3", calls)
	}
	for _, c := range calls {
		if c.req.GetMethod() != http.MethodPost || c.req.GetPath() != "/api/pull" || c.body["stream"] != true || c.body["model"] != "llama3.2" || c.body["insecure"] != true {
			t.Errorf("%s got %s %s %v", c.node, c.req.GetMethod(), c.req.GetPath(), c.body)
		}
	}
}

// With "stream": false the answer is one JSON object once every Node is
// done: Ollama's {"status":"success"}; the Nodes still stream (a Node that
// answered only at its end would look stalled).
func TestPullStreamFalseAnswersOnce(t *testing.T) {
	m := &fakeManager{nodes: twoNodes(), servers: map[string]fakeServer{
		"n1/ollama": {status: 200, body: pullOK}, "n2/ollama": {status: 200, body: pullOK}}}
	h, _ := manageEnv(t, m)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, manageReq(http.MethodPost, "/api/pull", adminKey, `{"model":"llama3.2","stream":false}`))
	if w.Code != http.StatusOK || strings.TrimSpace(w.Body.String()) != `{"status":"success"}` {
		t.Errorf("%d %q", w.Code, w.Body.String())
	}
	for _, c := range m.sent() {
		if c.body["stream"] != true {
			t.Errorf("%s was asked for stream %v", c.node, c.body["stream"])
		}
	}
	// Every Node refusing before any line, streamed or not: the HTTP
	// status says so, as Ollama answers an error before output.
	m.servers = map[string]fakeServer{"n1/ollama": {status: 400, body: `{"error":"invalid model name"}`}, "n2/ollama": {status: 400, body: `{"error":"invalid model name"}`}}
	for _, body := range []string{`{"model":"bad name","stream":false}`, `{"model":"bad name"}`} {
		w = httptest.NewRecorder()
		h.ServeHTTP(w, manageReq(http.MethodPost, "/api/pull", adminKey, body))
		if msg := errorTextOf(t, w.Body.String()); w.Code != http.StatusBadRequest || !strings.Contains(msg, "n1: invalid model name") || !strings.Contains(msg, "n2: invalid model name") {
			t.Errorf("%s: %d %q", body, w.Code, msg)
		}
	}
}

// A delete goes, by default, to the Nodes whose servers list the model;
// none listing it is Ollama's 404. Named Nodes get it whatever they list,
// and a Node named that cannot take it fails the call with its reason.
func TestDeleteChoosesItsNodes(t *testing.T) {
	m := &fakeManager{nodes: twoNodes(), servers: map[string]fakeServer{
		"n1/ollama": {status: 200}, "n2/ollama": {status: 404, body: `{"error":"model 'base' not found"}`}}}
	h, _ := manageEnv(t, m)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, manageReq(http.MethodDelete, "/api/delete", adminKey, `{"model":"base"}`))
	if w.Code != http.StatusOK || strings.TrimSpace(w.Body.String()) != `{"status":"success","nodes":["n1"]}` {
		t.Errorf("delete of a model n1 lists: %d %q", w.Code, w.Body.String())
	}
	if calls := m.sent(); len(calls) != 1 || calls[0].node != "n1" || calls[0].req.GetMethod() != http.MethodDelete {
		t.Errorf("calls %+v, want n1's alone", calls)
	}

	w = httptest.NewRecorder()
	h.ServeHTTP(w, manageReq(http.MethodDelete, "/api/delete", adminKey, `{"model":"nowhere"}`))
	if msg := errorTextOf(t, w.Body.String()); w.Code != http.StatusNotFound || msg != "model 'nowhere' not found" {
		t.Errorf("delete of a model nobody lists: %d %q", w.Code, msg)
	}

	m.calls = nil
	r := manageReq(http.MethodDelete, "/api/delete", adminKey, `{"model":"base"}`)
	r.Header.Set(NodesHeader, "n2, n9, n3")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	msg := errorTextOf(t, w.Body.String())
	for _, want := range []string{"n2: model 'base' not found", "n9: not connected to this Edge", "n3: suspect"} {
		if !strings.Contains(msg, want) {
			t.Errorf("named delete: %q lacks %q", msg, want)
		}
	}
	if w.Code != http.StatusBadGateway {
		t.Errorf("named delete with mixed failures: %d, want 502", w.Code)
	}
	if calls := m.sent(); len(calls) != 1 || calls[0].node != "n2" {
		t.Errorf("calls %+v, want n2's alone", calls)
	}

	// By label, in the body: the field does not reach the server.
	m.calls = nil
	w = httptest.NewRecorder()
	h.ServeHTTP(w, manageReq(http.MethodPost, "/api/copy", adminKey, `{"source":"base","destination":"b2","labels":{"gpu":"a"}}`))
	if calls := m.sent(); w.Code != http.StatusOK || len(calls) != 1 || calls[0].node != "n1" || calls[0].body["labels"] != nil {
		t.Errorf("copy by label: %d %q, calls %+v", w.Code, w.Body.String(), calls)
	}
}

// A Node's line keeps the fields the Edge does not know; one that is not
// JSON is passed as a status.
func TestRenameKeepsFieldsAndNamesTheNode(t *testing.T) {
	out, errMsg, ok := rename([]byte(`{"status":"pulling abc","digest":"sha256:0123456789abcdef","total":5,"extra":[1]}`), "gpu1")
	var l map[string]any
	if err := json.Unmarshal(out, &l); err != nil || errMsg != "" || ok {
		t.Fatalf("%q %q %v %v", out, errMsg, ok, err)
	}
	if l["status"] != "gpu1: pulling abc" || l["digest"] != "gpu1 0123456789ab" || l["total"] != 5.0 || l["extra"] == nil {
		t.Errorf("renamed %v", l)
	}
	if out, _, _ := rename([]byte("not json"), "gpu1"); !bytes.Equal(out, []byte(`{"status":"gpu1: not json"}`+"\n")) {
		t.Errorf("not JSON: %q", out)
	}
	if _, _, ok := rename([]byte(`{"status":"success"}`), "gpu1"); !ok {
		t.Error("success not seen")
	}
}

// A client that goes away mid-pull cancels every Node's call, and the
// handler returns (the package's goleak check: no part left behind).
func TestPullClientGoneCancelsEveryNode(t *testing.T) {
	m := &fakeManager{nodes: twoNodes(), servers: map[string]fakeServer{
		"n1/ollama": {status: 200, body: `{"status":"pulling manifest"}` + "\n", hang: true},
		"n2/ollama": {status: 200, hang: true}}}
	h, _ := manageEnv(t, m)
	ctx, cancel := context.WithCancel(t.Context())
	r := manageReq(http.MethodPost, "/api/pull", adminKey, `{"model":"big"}`).WithContext(ctx)
	w := &firstLine{ResponseRecorder: httptest.NewRecorder(), seen: cancel}
	h.ServeHTTP(w, r) // returns only once both parts have ended
	if !strings.Contains(w.Body.String(), "n1: pulling manifest") || strings.Contains(w.Body.String(), "success") || strings.Contains(w.Body.String(), "error") {
		t.Errorf("body %q", w.Body.String())
	}
}

// firstLine calls seen after the first write: the client leaves then.
type firstLine struct {
	*httptest.ResponseRecorder
	seen func()
}

func (w *firstLine) Write(p []byte) (int, error) {
	n, err := w.ResponseRecorder.Write(p)
	w.seen()
	return n, err
}
