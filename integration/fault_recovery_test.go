package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/quicwire"
)

// Issue 26 in the fault suite: recovery once the fault is over. Real edged
// and noded processes, Nodes in network namespaces (netns_test.go), the
// daemons' real liveness profile (a 45 s heartbeat wait: no
// --test-liveness-divisor, whose Edge-only scaling would not shorten the
// Node's own profile, so the two sides would disagree about the cut). The
// cuts run at once on one fleet and the Edge restarts on fleets of their
// own, beside TestFault, so the whole addition takes about as long as the
// longest cut (about 90 s).
//
// Measured figures are logged as "fault timing:" lines, like TestFault's;
// the ones the README quotes are also logged as "recovery figure:" lines:
//
//	go test -run TestFaultRecovery -v ./integration/ | grep 'recovery figure:'

// Bounds of issue 26 ("within a few seconds of the heal", "every Node ready
// within 2 s of the restart").
const (
	// healWithin: a new request's first byte after a link heals, and a
	// fenced Node's ready after a long cut heals.
	healWithin = 5 * time.Second
	// restartReadyWithin: every Node ready after a restarted Edge's
	// "serving" log line.
	restartReadyWithin = 2 * time.Second
	// restartReadyBound: what the test holds a Node to, with a margin for
	// a loaded machine (a miss of restartReadyWithin is reported).
	restartReadyBound = 4 * time.Second
	// restartWaitMax bounds the wait for a Node after an Edge restart, far
	// beyond restartReadyWithin, so that a slow recovery (a Node waiting out
	// its heartbeat: about 47 s) is measured and reported, not only timed
	// out.
	restartWaitMax = 90 * time.Second
)

// heartbeatWait is how long a heartbeat may go unanswered before the
// connection is fenced: a cut shorter than it should lose nothing.
var heartbeatWait = quicwire.DefaultLiveness.ResponseWait

// TestFaultRecovery runs issue 26's scenarios at once (see TestFault for
// why as goroutines rather than parallel tests). Run one with
// -run 'TestFaultRecovery/LinkCuts/20s'.
func TestFaultRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: skipped in -short mode (it runs real daemons for minutes)")
	}
	t.Parallel()
	if _, err := fakeBin(); err != nil {
		t.Fatal(err)
	}
	scenarios := []struct {
		name string
		run  func(*testing.T)
	}{
		{"LinkCuts", faultLinkCutsRecover},
		{"EdgeRestartWithDataDir", func(t *testing.T) { faultEdgeRestartRecovers(t, restartDataDir) }},
		{"EdgeRestartWithoutDataDir", func(t *testing.T) { faultEdgeRestartRecovers(t, restartIdentityKey) }},
		{"EdgeRestartLoopbackWithoutDataDir", func(t *testing.T) { faultEdgeRestartRecovers(t, restartLoopback) }},
	}
	var wg sync.WaitGroup
	for _, s := range scenarios {
		wg.Go(func() { t.Run(s.name, s.run) })
	}
	wg.Wait()
}

// --- link cuts ---

// linkCuts are issue 26's cuts: three shorter than the heartbeat wait
// (the first shorter than suspicion too), one longer.
var linkCuts = []time.Duration{5 * time.Second, 20 * time.Second, 40 * time.Second, 60 * time.Second}

// cutNode is the Node whose link is cut for d, and its models: a fast
// one that names it, and a minute-long stream. Only it serves them, so
// what a client of them sees is what the cut did.
type cutNode struct {
	id         string
	d          time.Duration
	fast, slow fakeollama.Model
}

func newCutNode(d time.Duration) cutNode {
	id := fmt.Sprintf("cut%d", int(d.Seconds()))
	return cutNode{
		id:   id,
		d:    d,
		fast: fakeollama.Model{Name: "m-" + id + ":latest", Text: id + " says hello from the fault suite"},
		slow: fakeollama.Model{Name: "slow-" + id + ":latest", TokenCount: 600, TokenDelay: 100 * time.Millisecond},
	}
}

func (c cutNode) fastName() string { return strings.TrimSuffix(c.fast.Name, ":latest") }
func (c cutNode) slowName() string { return strings.TrimSuffix(c.slow.Name, ":latest") }

// faultLinkCutsRecover: issue 26, P4, R8, R9. One Edge, a Node per cut,
// each in its namespace, each streaming through both APIs when its link is
// cut (silently both ways, netns.cut) for 5, 20, 40 or 60 s. The cuts run
// at once, each in its own subtest.
func faultLinkCutsRecover(t *testing.T) {
	requireNetns(t)
	f := newFaultFleet(t)
	var nodes []cutNode
	for _, d := range linkCuts {
		c := newCutNode(d)
		f.addNode(nodeSpec{
			id:     c.id,
			models: []fakeollama.Model{c.fast, c.slow},
			providers: []providerSpec{
				{name: "ollama", capacity: 4, targets: []string{c.fast.Name}},
				{name: "slow", capacity: 2, targets: []string{c.slow.Name}},
			},
		})
		nodes = append(nodes, c)
	}
	var wg sync.WaitGroup
	for _, c := range nodes {
		wg.Go(func() {
			t.Run(c.d.String(), func(t *testing.T) {
				ft := *f // the same fleet, failing this subtest
				ft.t = t
				if c.d < heartbeatWait {
					cutShorterThanHeartbeat(&ft, c)
				} else {
					cutLongerThanHeartbeat(&ft, c)
				}
			})
		})
	}
	wg.Wait()
}

// cutShorterThanHeartbeat: issue 26, P4. A link that heals within the
// heartbeat wait loses nothing: the streams in flight complete with their
// whole text (neither duplicated, skipped nor reordered), the Node keeps
// its generation, and every new request (one sent during the cut, one
// sent at the heal, through each API) has its first byte within
// healWithin of the heal. The client retries what it is told to retry (a
// 503 with Retry-After while the Node is suspect, a 502 for a request
// that went to the Node and was moved off it when it turned suspect), as
// the OpenAI SDKs do; the retries are logged with the figures.
func cutShorterThanHeartbeat(f *faultFleet, c cutNode) {
	t := f.t
	ns := f.nodes[c.id].ns
	v0, _ := f.view(c.id)
	streams := map[clientAPI]*inFlight{}
	for _, a := range []clientAPI{openAI, ollama} {
		streams[a] = f.startStream(a, c.slowName(), 3*time.Minute)
	}
	what := fmt.Sprintf("link cut %v", c.d)

	cut := time.Now()
	ns.cut()
	heal := cut.Add(c.d)
	if c.d > quicwire.DefaultLiveness.SuspectAfter()+2*time.Second {
		f.waitSuspect(c.id, cut, what)
	}
	// A request sent during the cut waits (the Node is suspect: it queues)
	// or goes to the Node and waits for the link.
	// Sent beside the cut, not before the heal: timedRequests returns only
	// once its requests are answered, which needs the heal.
	queuedAt := heal.Add(-min(c.d/2, 10*time.Second))
	time.Sleep(time.Until(queuedAt))
	queuedDone := make(chan []timedResult, 1)
	go func() { queuedDone <- f.timedRequests(c.fastName(), c.d+30*time.Second) }()
	time.Sleep(time.Until(heal))
	healed := time.Now()
	ns.heal()
	recoveryFigure(t, "cut=%v held=%.1fs", c.d, healed.Sub(cut).Seconds())
	fresh := f.timedRequests(c.fastName(), 30*time.Second)
	queued := <-queuedDone

	for _, set := range []struct {
		name string
		reqs []timedResult
	}{{"queued during the cut", queued}, {"sent at the heal", fresh}} {
		for _, r := range set.reqs {
			if !r.done || r.servedBy() != c.id {
				t.Errorf("%s: a %s request %s: want a complete answer from %s, got %v", what, r.api, set.name, c.id, r.streamResult)
				continue
			}
			after := r.firstByte.Sub(healed).Seconds()
			f.timing("%s: a %s request %s had its first byte %.1fs after the heal (refusals retried before: %s)", what, r.api, set.name, after, retriesSummary(r.retried))
			recoveryFigure(t, "cut=%v request=%s api=%s first_byte_after_heal=%.2fs retried=%d", c.d, strings.ReplaceAll(set.name, " ", "_"), r.api, after, len(r.retried))
			if after > healWithin.Seconds() {
				t.Errorf("issue 26: %s: a %s request %s had its first byte %.1fs after the heal, want within %v", what, r.api, set.name, after, healWithin)
			}
		}
	}
	if v, at, ok := f.waitView(c.id, 30*time.Second, func(v faultView) bool { return !v.Suspect }); ok {
		f.timing("%s: %s dispatchable again %.1fs after the heal", what, c.id, at.Sub(healed).Seconds())
	} else {
		t.Errorf("%s: %s still suspect 30s after the heal: %v", what, c.id, v)
	}

	// Nothing lost: each stream's text is its whole answer, in order. After
	// a cut of about half the heartbeat wait or more, the Node's fresh
	// connection usually wins the race at the heal and replaces the old
	// one, whose streams then drain on it: they resume when its sender's
	// retransmission backoff ends (quic-go doubles its probe timeout up to
	// 60 s), seconds to tens of seconds after the heal.
	want := c.slow.AnswerText()
	for a, s := range streams {
		r := s.wait(t, 3*time.Minute, what+": a stream in flight")
		whole := r.done && r.content == want
		recoveryFigure(t, "cut=%v stream_api=%s whole=%v ended_after_heal=%.1fs", c.d, a, whole, r.ended.Sub(healed).Seconds())
		if !whole {
			t.Errorf("issue 26: %s, shorter than the heartbeat wait (%v): the %s stream in flight was lost or changed: %v (%d of %d bytes of the answer; whole and in order: %v)",
				what, heartbeatWait, a, r, len(r.content), len(want), r.content == want)
			continue
		}
		f.timing("%s: the %s stream in flight completed with its whole text %.1fs after the heal", what, a, r.ended.Sub(healed).Seconds())
	}
	v, _ := f.view(c.id)
	if v.State != "ready" {
		t.Errorf("issue 26: %s, shorter than the heartbeat wait: %s is %v, want ready", what, c.id, v)
	}
	recoveryFigure(t, "cut=%v replaced=%v", c.d, v.Generation != v0.Generation)
}

// cutLongerThanHeartbeat: R8, R9, issue 26. A cut past the heartbeat wait
// fences the Node with heartbeat_timeout as before and its streams end
// with their error in their API's form; once healed, the Node is ready
// again (a higher generation) within healWithin, and serves.
func cutLongerThanHeartbeat(f *faultFleet, c cutNode) {
	t := f.t
	ns := f.nodes[c.id].ns
	v0, _ := f.view(c.id)
	streams := map[clientAPI]*inFlight{}
	for _, a := range []clientAPI{openAI, ollama} {
		streams[a] = f.startStream(a, c.slowName(), 3*time.Minute)
	}
	what := fmt.Sprintf("link cut %v", c.d)

	cut := time.Now()
	ns.cut()
	f.waitSuspect(c.id, cut, what)
	f.waitFence(c.id, v0.Generation, cut, what)
	for a, s := range streams {
		r := s.wait(t, 30*time.Second, what+": a stream on the fenced Node")
		assertStreamError(t, fmt.Sprintf("%s: the %s stream in flight", what, a), r, "")
	}
	time.Sleep(time.Until(cut.Add(c.d)))
	healed := time.Now()
	ns.heal()
	v, at, ok := f.waitView(c.id, 60*time.Second, func(v faultView) bool {
		return v.Generation > v0.Generation && v.State == "ready" && v.allOnline(2)
	})
	if !ok {
		t.Fatalf("%s: %s not back ready above generation %d within 60s of the heal; last view %v", what, c.id, v0.Generation, v)
	}
	after := at.Sub(healed).Seconds()
	f.timing("%s: %s ready again, generation %d -> %d, %.1fs after the heal", what, c.id, v0.Generation, v.Generation, after)
	recoveryFigure(t, "cut=%v node_ready_after_heal=%.2fs", c.d, after)
	if after > healWithin.Seconds() {
		t.Errorf("issue 26: %s: %s ready %.1fs after the heal, want within %v", what, c.id, after, healWithin)
	}
	for _, r := range f.timedRequests(c.fastName(), 0) {
		if !r.done || r.servedBy() != c.id {
			t.Errorf("%s: a %s request once %s was back: %v", what, r.api, c.id, r.streamResult)
		}
	}
}

// timedResult is what a retrying client saw: its last try, when that
// try's first content came, and the statuses of the tries before it.
type timedResult struct {
	streamResult
	firstByte time.Time
	retried   []string // "503 model_not_ready", ...
}

// retryable is a refusal a client is told to retry, or that the OpenAI
// SDKs retry on their own (408, 409, 429, 5xx), before any content.
func retryable(r streamResult) bool {
	return r.content == "" && r.err == nil &&
		(r.status == http.StatusRequestTimeout || r.status == http.StatusConflict || r.status == http.StatusTooManyRequests || r.status >= 500)
}

// refusalCode is the error code or message a refusal carries, short.
var refusalCode = regexp.MustCompile(`"code":"([a-z_]+)"`)

// timedRequests sends a streamed chat for model through each API at once,
// as a client that retries a refusal it may retry every 250 ms (sooner
// than Retry-After, to measure the Edge rather than the hint) for up to
// retryFor, and returns what each saw and when its first content came.
func (f *faultFleet) timedRequests(model string, retryFor time.Duration) []timedResult {
	apis := []clientAPI{openAI, ollama}
	out := make([]timedResult, len(apis))
	var wg sync.WaitGroup
	for i, a := range apis {
		wg.Go(func() {
			giveUp := time.Now().Add(retryFor)
			for {
				first := make(chan struct{})
				res := make(chan streamResult, 1)
				go func() { res <- f.stream(a, model, 2*requestWithin, first) }()
				tr := timedResult{retried: out[i].retried}
				select {
				case <-first:
					tr.firstByte = time.Now()
					tr.streamResult = <-res
				case r := <-res:
					tr.streamResult = r
					select {
					case <-first: // closed just before the end
						tr.firstByte = r.ended
					default:
					}
				}
				out[i] = tr
				if !retryable(tr.streamResult) || time.Now().After(giveUp) {
					return
				}
				code := http.StatusText(tr.status)
				if m := refusalCode.FindStringSubmatch(tr.errMsg); m != nil {
					code = m[1]
				}
				out[i].retried = append(out[i].retried, fmt.Sprintf("%d %s", tr.status, code))
				time.Sleep(250 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	return out
}

// retriesSummary counts a client's retried refusals by status and code.
func retriesSummary(retried []string) string {
	n := map[string]int{}
	for _, r := range retried {
		n[r]++
	}
	return fmt.Sprint(n)
}

// recoveryFigure logs one of the figures the README quotes.
func recoveryFigure(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("recovery figure: "+format, args...)
}

// --- Edge restarts ---

// restartMode is how the restarted Edge is configured, which decides the
// QUIC stateless reset key it comes back with (internal/edge/resetkey).
type restartMode int

const (
	// restartDataDir: managed mode with data_dir (the key in a file).
	restartDataDir restartMode = iota
	// restartIdentityKey: managed mode without data_dir (the key derived
	// from the Edge's identity key).
	restartIdentityKey
	// restartLoopback: loopback mode without data_dir (the README's
	// two-process setup): a new random key at every start, so the Nodes
	// cannot recognise the new Edge's resets.
	restartLoopback
)

func (m restartMode) String() string {
	return [...]string{"with data_dir", "without data_dir (managed)", "without data_dir (loopback)"}[m]
}

// newRestartFleet starts an Edge configured for m, with the fault suite's
// ports and routes.
func newRestartFleet(t *testing.T, m restartMode) *faultFleet {
	t.Helper()
	f := &faultFleet{t: t, dir: t.TempDir(), nodes: map[string]*faultNode{}, loopback: m == restartLoopback}
	httpPort := freePort(t, "tcp")
	f.base = fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	f.edgeConf = filepath.Join(f.dir, "edge.yaml")
	if f.loopback {
		f.quicPort = freePort(t, "udp")
		writeFile(t, f.edgeConf, fmt.Sprintf(`
edge_id: edge-1
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback, trust_domain: iop.test}
api: {allow_anonymous: true}
`, f.quicPort, httpPort))
		f.startEdge("edged")
		return f
	}
	for _, args := range [][]string{
		{"tls", "ca", "create", "--trust-domain", "iop.test"},
		{"tls", "cert", "create", "--edge", "edge-1", "--ip", "127.0.0.1"},
	} {
		if out, err := run(t, f.dir, bin.edged, args...); err != nil {
			t.Fatalf("edged %v: %v\n%s", args, err, out)
		}
	}
	f.quicPort = freeUDPPortAnyAddr(t)
	conf := fmt.Sprintf(`
edge_id: edge-1
listen: {quic: "0.0.0.0:%d", http: "127.0.0.1:%d"}
identity: {mode: mtls, trust_domain: iop.test, ca_file: iop-ca.pem, cert_file: edge-edge-1.pem, key_file: edge-edge-1-key.pem}
`, f.quicPort, httpPort)
	if m == restartDataDir {
		conf += fmt.Sprintf("data_dir: %q\n", filepath.Join(f.dir, "data"))
	}
	writeFile(t, f.edgeConf, conf)
	f.startEdge("edged")
	return f
}

// faultEdgeRestartRecovers: issue 26, P4, R9. Two Nodes (in namespaces,
// or on the host's loopback in loopback mode) serve the fast model, with
// the daemon's own reconnect backoff; the Edge is killed (kill -9) while
// clients ask for the model through each API, and restarted. Every Node
// is ready within restartReadyWithin of the restarted Edge's "serving"
// log line, and from that line on no request for the model is answered
// 404: 503 with Retry-After until a Node is back, then 200.
func faultEdgeRestartRecovers(t *testing.T, m restartMode) {
	if m != restartLoopback {
		requireNetns(t)
	}
	f := newRestartFleet(t, m)
	ids := []string{"r1", "r2"}
	for _, id := range ids {
		f.addNode(nodeSpec{
			id:               id,
			models:           []fakeollama.Model{fastAnswer(id)},
			providers:        []providerSpec{{name: "ollama", capacity: 4, targets: []string{fastModel + ":latest"}}},
			hostOnly:         m == restartLoopback,
			defaultReconnect: true,
		})
	}
	for _, a := range recoveryAPIs {
		if code, _, body := a.ask(f.base, fastModel); code != http.StatusOK {
			t.Fatalf("%s before the restart: %d %s", a.name, code, body)
		}
	}
	if m == restartDataDir {
		// The Edge keeps what it served in data_dir; give it a moment to
		// write it, and go on either way (the 404 check says what is missing).
		served := filepath.Join(f.dir, "data", "served.json")
		_, _, ok := waitUntil(10*time.Second, func() bool {
			b, _ := os.ReadFile(served)
			return strings.Contains(string(b), fastModel+":latest")
		})
		if !ok {
			t.Logf("%s: the Edge wrote no %s naming %s within 10s", m, served, fastModel)
		}
	}
	gens := map[string]uint64{}
	for _, id := range ids {
		v, _ := f.view(id)
		gens[id] = v.Generation
	}

	old := f.edge
	signalProc(t, old, syscall.SIGKILL)
	<-old.done
	f.startEdge("edged (restarted)")
	serving := logTime(t, f.edge, "serving http", "")

	// Clients ask through each API from the restart on, until every Node
	// is ready and each API has been answered 200.
	counts := map[int]int{}
	oks := map[string]bool{}
	var first200 time.Time
	deadline := serving.Add(restartWaitMax)
	for i := 0; ; i++ {
		a := recoveryAPIs[i%len(recoveryAPIs)]
		code, retryAfter, body := a.ask(f.base, fastModel)
		at := time.Since(serving).Seconds()
		counts[code]++
		switch code {
		case http.StatusOK:
			oks[a.name] = true
			if first200.IsZero() {
				first200 = time.Now()
			}
		case http.StatusServiceUnavailable:
			if retryAfter == "" {
				t.Errorf("issue 26: %s: %s %.1fs after the restart: 503 without Retry-After: %s", m, a.name, at, body)
			}
		case http.StatusNotFound:
			if counts[code] > 1 {
				break // counted; the first one per Edge is reported
			}
			t.Errorf("issue 26: %s: %s %.1fs after the restart: a model served before the restart answered 404 (want 503 with Retry-After until its Node is back): %s", m, a.name, at, clip(body, 200))
		default:
			t.Errorf("%s: %s %.1fs after the restart: %d, want 200, or 503 with Retry-After: %s", m, a.name, at, code, clip(body, 200))
		}
		allReady := true
		for _, id := range ids {
			allReady = allReady && f.edgeLogged("node ready", id)
		}
		if allReady && len(oks) == len(recoveryAPIs) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: not every Node ready and every API answered 200 within %v of the restart (answered 200: %v)", m, restartWaitMax, oks)
			break
		}
		time.Sleep(50 * time.Millisecond) // clients asking, and retrying faster than Retry-After
	}
	f.timing("kill -9 edged (%s): answers from the restart until every Node was ready, by status: %v", m, counts)
	recoveryFigure(t, "restart=%q status_404=%d status_503=%d", m, counts[http.StatusNotFound], counts[http.StatusServiceUnavailable])
	if !first200.IsZero() {
		recoveryFigure(t, "restart=%q first_200_after_serving=%.2fs", m, first200.Sub(serving).Seconds())
	}

	for _, id := range ids {
		if !f.edgeLogged("node ready", id) {
			t.Errorf("issue 26: %s: node %s not ready within %v of the restart", m, id, restartWaitMax)
			recoveryFigure(t, "restart=%q node=%s ready_after_serving=none_within_%v", m, id, restartWaitMax)
			continue
		}
		ready := logTime(t, f.edge, "node ready", id)
		after := ready.Sub(serving).Seconds()
		f.timing("kill -9 edged (%s): node %s ready %.2fs after the restarted Edge's serving line", m, id, after)
		recoveryFigure(t, "restart=%q node=%s ready_after_serving=%.2fs", m, id, after)
		// An idle Node notices a restarted Edge at its next keep-alive
		// (every second, Liveness.NodeKeepAlive), then waits 500 ms for an
		// answer and 500 ms for its heartbeat's before it races a fresh
		// connection: about 2 s at worst, the target. On a loaded
		// machine that can spill over; held here to a bound with margin
		// (it was 6–52 s before), a miss of the 2 s target reported.
		switch {
		case after > restartReadyBound.Seconds():
			t.Errorf("issue 26: %s: node %s ready %.1fs after the restarted Edge began serving, want within %v", m, id, after, restartReadyBound)
		case after > restartReadyWithin.Seconds():
			t.Logf("issue 26: %s: node %s ready %.1fs after the restarted Edge began serving; the target is %v", m, id, after, restartReadyWithin)
		}
		if v, _ := f.view(id); v.Generation <= gens[id] && !f.loopback {
			t.Errorf("%s: node %s back at generation %d, want above %d", m, id, v.Generation, gens[id])
		}
	}
}

// logLine matches a text-format log line's time.
var logLine = regexp.MustCompile(`^time=(\S+) `)

// logTime returns the time of p's first log line with msg (and node=node
// when node is not empty), waiting for it as long as restartWaitMax.
func logTime(t *testing.T, p *proc, msg, node string) time.Time {
	t.Helper()
	var at time.Time
	_, _, ok := waitUntil(restartWaitMax, func() bool {
		for _, l := range strings.Split(p.out.String(), "\n") {
			if !strings.Contains(l, `msg="`+msg+`"`) || (node != "" && !strings.Contains(l, " node="+node)) {
				continue
			}
			m := logLine.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			if ts, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
				at = ts
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("%s logged no %q line (node %q) within %v:\n%s", p.name, msg, node, restartWaitMax, p.out)
	}
	return at
}

// waitUntil polls cond every 20 ms for up to within; it returns when cond
// first held, how long that took, and whether it did.
func waitUntil(within time.Duration, cond func() bool) (time.Time, time.Duration, bool) {
	began := time.Now()
	for {
		if cond() {
			return time.Now(), time.Since(began), true
		}
		if time.Since(began) > within {
			return time.Time{}, 0, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// recoveryAPI is one client API asked for a model, non-streaming.
type recoveryAPI struct {
	name, path, body string
	header           map[string]string
}

var recoveryAPIs = []recoveryAPI{
	{name: "openai", path: "/v1/chat/completions", body: `{"model":%q,"messages":[{"role":"user","content":"hi"}]}`},
	{name: "anthropic", path: "/v1/messages", body: `{"model":%q,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`,
		header: map[string]string{"anthropic-version": "2023-06-01"}},
	{name: "ollama", path: "/api/chat", body: `{"model":%q,"stream":false,"messages":[{"role":"user","content":"hi"}]}`},
}

// ask sends one request for model and returns its status, Retry-After and
// body (0 and the error when it could not be sent: the Edge is down).
func (a recoveryAPI) ask(base, model string) (int, string, string) {
	req, _ := http.NewRequest(http.MethodPost, base+a.path, strings.NewReader(fmt.Sprintf(a.body, model)))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range a.header {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: requestWithin}).Do(req)
	if err != nil {
		return 0, "", err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
}
