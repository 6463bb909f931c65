package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/internal/pgtest"
)

// Issue 22: several Edges in front of the same Nodes, their shared state in
// a real PostgreSQL (pgtest: Debian's server, started for the test as its
// own user). Three edged on the host, each with its own data_dir, sharing
// one CA (each issues its own certificate from it) and one database; two
// noded, each in a network namespace of its own, joined with tokens
// through different Edges, each connected to all three Edges from the
// cluster's list. Sequential phases on the one cluster:
//
//  1. membership: every Edge sees the three; every Node is ready on every
//     Edge;
//  2. one join token, redeemed through one Edge, refused by the others;
//  3. load through all three Edges while one is killed with kill -9: the
//     requests through the other two never notice, the dead Edge's clients
//     get errors, the Nodes cancel its runs at once, and no Node ever runs
//     more than its capacity (counted by its model server);
//  4. the database stopped for a while: serving goes on, a join is refused
//     with its reason, the usage ledger catches up once it is back;
//  5. `edged node remove` on one Edge fences the Node on the others within
//     2 s;
//  6. a planned stop (SIGTERM): the stopping Edge refuses new work with
//     503 edge_stopping and Retry-After, finishes the stream it carries,
//     and exits; the Nodes stay ready on the other Edge.
func TestCluster(t *testing.T) {
	requireNetns(t)
	pg := pgtest.NewServer(t)
	c := newTestCluster(t, pg.CreateDatabase(t), "edge-a", "edge-b", "edge-c")
	n1 := c.join("n1", "edge-a")
	n2 := c.join("n2", "edge-b")
	for _, n := range []*clusterNode{n1, n2} {
		for _, e := range c.edges {
			c.waitReadyOn(n.id, e)
		}
	}
	c.checkMembers(c.edges[0], []string{"edge-a", "edge-b", "edge-c"})

	t.Run("TokenIsSingleUseAcrossTheCluster", func(t *testing.T) { c.tokenSingleUse(t) })
	t.Run("EdgeKilledUnderLoad", func(t *testing.T) { c.edgeKilledUnderLoad(t, []*clusterNode{n1, n2}) })
	t.Run("DatabaseStopped", func(t *testing.T) { c.databaseStopped(t, pg) })
	t.Run("RemoveFencesOnEveryEdge", func(t *testing.T) { c.removeFencesEverywhere(t, n1) })
	t.Run("PlannedStopDrains", func(t *testing.T) { c.plannedStopDrains(t) })
}

// clusterCapacity is each Node's provider capacity: the most runs its
// model server may see at once, whatever the Edges do.
const clusterCapacity = 2

// testCluster is the three Edges, the database and the Nodes.
type testCluster struct {
	t     *testing.T
	dir   string
	dsn   string
	host  string // the address every Edge advertises its QUIC port on
	edges []*clusterEdge
	nodes map[string]*clusterNode
}

type clusterEdge struct {
	id, conf string
	quic     int
	base     string // its HTTP API
	proc     *proc
	dead     atomic.Bool
}

type clusterNode struct {
	id   string
	ns   *netns
	dir  string
	fake *proc
	url  string // the fake's base URL, from the host
	proc *proc
}

// clusterModel answers in about 6 s: long enough that a run the Nodes did
// not cancel at the kill would show, short enough to keep loops busy.
var clusterModel = fakeollama.Model{Name: "slow:latest", Text: strings.Repeat("tok ", 30), TokenDelay: 200 * time.Millisecond}

func newTestCluster(t *testing.T, dsn string, ids ...string) *testCluster {
	t.Helper()
	c := &testCluster{t: t, dir: t.TempDir(), dsn: dsn, host: hostAddr(t), nodes: map[string]*clusterNode{}}
	if out, err := run(t, c.dir, bin.edged, "tls", "ca", "create", "--trust-domain", "iop.test"); err != nil {
		t.Fatalf("edged tls ca create: %v\n%s", err, out)
	}
	for _, id := range ids {
		e := &clusterEdge{id: id, quic: freeUDPPortAnyAddr(t), conf: filepath.Join(c.dir, id+".yaml")}
		http := freePort(t, "tcp")
		e.base = fmt.Sprintf("http://127.0.0.1:%d", http)
		writeFile(t, e.conf, fmt.Sprintf(`edge_id: %s
listen: {quic: "0.0.0.0:%d", http: "127.0.0.1:%d"}
identity: {mode: mtls, trust_domain: iop.test, ca_file: iop-ca.pem}
enrollment: {ca_key_file: iop-ca-key.pem}
data_dir: %s-data
cluster:
  database_url: %q
  advertise_quic: "%s:%d"
shutdown_grace: 1m
`, id, e.quic, http, id, dsn, c.host, e.quic))
		c.edges = append(c.edges, e)
	}
	var wg sync.WaitGroup
	for _, e := range c.edges {
		e.proc = start(t, "edged "+e.id, bin.edged, "run", "--config", e.conf)
		wg.Go(func() { e.proc.waitOutput(regexp.MustCompile(`serving http`)) })
	}
	wg.Wait()
	// Every Edge goes before the namespaces do (see addNode in faults_test).
	t.Cleanup(func() {
		for _, e := range c.edges {
			e.proc.cmd.Process.Kill()
		}
	})
	return c
}

// hostAddr puts an address of its own on the host's loopback interface for
// the Edges to advertise: every namespace reaches it through its default
// route (the host takes a packet for any of its addresses on any
// interface), as the machines of a LAN reach the Edges' addresses.
func hostAddr(t *testing.T) string {
	t.Helper()
	var addr string
	for i := range 250 {
		a := fmt.Sprintf("10.78.%d.1", (int(netnsBase)+i)%250+1)
		if !hostHasAddr(a) {
			addr = a
			break
		}
	}
	if out, err := exec.Command("ip", "addr", "add", addr+"/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("ip addr add %s/32 dev lo: %v: %s", addr, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "addr", "del", addr+"/32", "dev", "lo").Run() })
	return addr
}

func (c *testCluster) edge(id string) *clusterEdge {
	for _, e := range c.edges {
		if e.id == id {
			return e
		}
	}
	c.t.Fatalf("no edge %s", id)
	return nil
}

// token runs `edged node add` against an Edge and returns the token.
func (c *testCluster) token(nodeID, edgeID string) string {
	c.t.Helper()
	e := c.edge(edgeID)
	out, err := run(c.t, c.dir, bin.edged, "node", "add", nodeID, "--config", e.conf)
	if err != nil {
		c.t.Fatalf("edged node add %s on %s: %v\n%s", nodeID, edgeID, err, out)
	}
	m := regexp.MustCompile(`--token (\S+)`).FindStringSubmatch(out)
	if m == nil {
		c.t.Fatalf("edged node add printed no token:\n%s", out)
	}
	return m[1]
}

// join makes a Node in a namespace of its own with its fake Ollama, joins
// it with a token from edgeID through edgeID, and runs it with a capacity
// of clusterCapacity and a fast reconnect.
func (c *testCluster) join(id, edgeID string) *clusterNode {
	t := c.t
	t.Helper()
	e := c.edge(edgeID)
	n := &clusterNode{id: id, ns: newNetns(t), dir: filepath.Join(c.dir, id)}
	n.ns.ip("-n", n.ns.name, "route", "add", "default", "via", n.ns.hostIP)
	fake, _ := fakeBin()
	models, _ := json.Marshal([]fakeollama.Model{clusterModel})
	modelsFile := filepath.Join(c.dir, id+"-models.json")
	writeFile(t, modelsFile, string(models))
	n.fake = n.ns.start(t, "fakeollama "+id, fake, "-addr", "0.0.0.0:11434", "-models", modelsFile)
	n.fake.waitOutput(regexp.MustCompile(`listening on`))
	n.url = fmt.Sprintf("http://%s:11434", n.ns.nsIP)

	token := c.token(id, edgeID)
	addr := fmt.Sprintf("%s:%d", c.host, e.quic)
	if out, err := run(t, c.dir, "ip", "netns", "exec", n.ns.name, bin.noded, "join", addr, "--token", token, "--dir", n.dir,
		"--ollama-url", "http://127.0.0.1:11434"); err != nil {
		t.Fatalf("noded join %s through %s: %v\n%s", id, edgeID, err, out)
	}
	// The joined configuration, with the test's capacity and reconnect.
	conf := filepath.Join(n.dir, "cluster-node.yaml")
	writeFile(t, conf, fmt.Sprintf(`node_id: %s
edge: {address: %q}
identity: {mode: mtls, trust_domain: iop.test, ca_file: ca.pem, cert_file: node.pem, key_file: node-key.pem}
lease_key_file: lease.key
drain_timeout: 5s
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
providers:
  - {name: ollama, adapter: ollama, capacity: %d, config: {base_url: "http://127.0.0.1:11434"}}
`, id, addr, clusterCapacity))
	n.proc = n.ns.start(t, "noded "+id, bin.noded, "run", "--config", conf)
	c.nodes[id] = n
	return n
}

// nodesOn is an Edge's /admin/v1/nodes.
func (c *testCluster) nodesOn(e *clusterEdge) []nodeView {
	c.t.Helper()
	return adminNodes(c.t, e.base)
}

func (c *testCluster) viewOn(e *clusterEdge, id string) (nodeView, bool) {
	for _, v := range c.nodesOn(e) {
		if v.ID == id {
			return v, true
		}
	}
	return nodeView{}, false
}

// waitReadyOn waits until node id is ready on e.
func (c *testCluster) waitReadyOn(id string, e *clusterEdge) {
	c.t.Helper()
	waitNode(c.t, e.base, id, "ready on "+e.id, func(v nodeView) bool { return v.State == "ready" })
}

// clusterView is the part of /admin/v1/cluster the test reads.
type clusterView struct {
	Self     string `json:"self"`
	Database string `json:"database"`
	Edges    []struct {
		ID       string `json:"id"`
		Alive    bool   `json:"alive"`
		Stopping bool   `json:"stopping"`
	} `json:"edges"`
	Nodes []struct {
		ID    string `json:"id"`
		Edges []struct {
			Edge  string `json:"edge"`
			State string `json:"state"`
		} `json:"edges"`
	} `json:"nodes"`
}

func (c *testCluster) cluster(e *clusterEdge) clusterView {
	c.t.Helper()
	var v clusterView
	getJSON(c.t, e.base+"/admin/v1/cluster", &v)
	return v
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil && resp.StatusCode == http.StatusOK {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode
}

// alive are the Edges e's view says are alive.
func (v clusterView) alive() []string {
	var out []string
	for _, e := range v.Edges {
		if e.Alive {
			out = append(out, e.ID)
		}
	}
	return out
}

// checkMembers waits until e's cluster view lists want alive, and every
// Node connected to each of them.
func (c *testCluster) checkMembers(e *clusterEdge, want []string) {
	c.t.Helper()
	var v clusterView
	ok := waitCond(15*time.Second, func() bool {
		v = c.cluster(e)
		if !slices.Equal(v.alive(), want) || len(v.Nodes) != len(c.nodes) {
			return false
		}
		for _, n := range v.Nodes {
			var on []string
			for _, l := range n.Edges {
				if l.State == "ready" {
					on = append(on, l.Edge)
				}
			}
			slices.Sort(on)
			if !slices.Equal(on, want) {
				return false
			}
		}
		return true
	})
	if !ok {
		c.t.Fatalf("%s's cluster view: %+v; want alive %v, every Node ready on each", e.id, v, want)
	}
}

func waitCond(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tokenSingleUse: a token made on edge-a and redeemed through edge-a is
// refused by edge-b and edge-c, and one never redeemed is good on any.
func (c *testCluster) tokenSingleUse(t *testing.T) {
	token := c.token("n9", "edge-a")
	joinVia := func(edgeID, dir string) (string, error) {
		n := c.nodes["n1"]
		return run(t, c.dir, "ip", "netns", "exec", n.ns.name, bin.noded, "join",
			fmt.Sprintf("%s:%d", c.host, c.edge(edgeID).quic), "--token", token, "--dir", filepath.Join(c.dir, dir))
	}
	if out, err := joinVia("edge-a", "n9-a"); err != nil {
		t.Fatalf("the token through edge-a: %v\n%s", err, out)
	}
	for _, id := range []string{"edge-b", "edge-c"} {
		out, err := joinVia(id, "n9-"+id)
		if err == nil || !strings.Contains(out, "used") {
			t.Errorf("the token redeemed through edge-a, again through %s: err %v, want refused as used:\n%s", id, err, out)
		}
	}
}

// clusterStream is one streamed chat through an Edge, as fault_clients's.
func (c *testCluster) stream(e *clusterEdge, a clientAPI, first chan<- struct{}) streamResult {
	f := &faultFleet{t: c.t, base: e.base}
	return f.stream(a, "slow", time.Minute, first)
}

// edgeKilledUnderLoad: clients stream through all three Edges, two per
// Edge and API, in closed loops; edge-c is killed with kill -9 mid-stream.
func (c *testCluster) edgeKilledUnderLoad(t *testing.T, nodes []*clusterNode) {
	for _, n := range nodes {
		resetFake(t, n)
	}
	victim := c.edge("edge-c")
	type outcome struct {
		edge string
		r    streamResult
	}
	var (
		mu       sync.Mutex
		outcomes []outcome
		wg       sync.WaitGroup
	)
	stop := make(chan struct{})
	firsts := make(chan string, 256)
	for _, e := range c.edges {
		for _, a := range []clientAPI{openAI, ollama} {
			for range 2 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						first := make(chan struct{})
						go func() {
							select {
							case <-first:
								firsts <- e.id
							case <-time.After(time.Minute):
							}
						}()
						r := c.stream(e, a, first)
						mu.Lock()
						outcomes = append(outcomes, outcome{e.id, r})
						mu.Unlock()
						if e.dead.Load() {
							return
						}
					}
				})
			}
		}
	}
	// Kill once every Edge has had answers under way, the victim's last.
	answering := map[string]int{}
	for answering["edge-a"] == 0 || answering["edge-b"] == 0 || answering[victim.id] == 0 {
		select {
		case id := <-firsts:
			answering[id]++
		case <-time.After(time.Minute):
			t.Fatalf("not every Edge had a stream answering within a minute: %v", answering)
		}
	}
	// Then kill just after a victim's stream has begun to answer, so its run
	// has most of its ~6 s left on a Node: one that began long before could
	// end on its own before the Nodes hear the Edge is gone, and the test
	// would see no run to cancel (a flake .ci/run met under load).
	for fresh := false; !fresh; {
		select {
		case id := <-firsts:
			fresh = id == victim.id
		case <-time.After(time.Minute):
			t.Fatalf("no new stream through %s began to answer within a minute", victim.id)
		}
	}
	time.Sleep(500 * time.Millisecond)
	killed := time.Now()
	victim.dead.Store(true)
	_ = victim.proc.cmd.Process.Signal(syscall.SIGKILL)
	<-victim.proc.done
	time.Sleep(8 * time.Second)
	close(stop)
	wg.Wait()

	var byEdge = map[string][2]int{} // done, failed
	for _, o := range outcomes {
		counts := byEdge[o.edge]
		if o.r.done {
			counts[0]++
		} else {
			counts[1]++
		}
		byEdge[o.edge] = counts
		switch {
		case o.edge != victim.id && !o.r.done:
			t.Errorf("a %s request through %s, which stayed up, failed: %v", o.r.api, o.edge, o.r)
		case o.edge == victim.id && !o.r.done && o.r.ended.Before(killed):
			t.Errorf("a %s request through %s failed before it was killed: %v", o.r.api, o.edge, o.r)
		case o.edge == victim.id && o.r.ended.After(killed) && o.r.done:
			t.Errorf("a %s request through the killed %s ended as a success after the kill: %v", o.r.api, o.edge, o.r)
		}
	}
	t.Logf("cluster figure: kill -9 of %s under load: completed/failed by Edge %v", victim.id, byEdge)
	if byEdge[victim.id][1] == 0 {
		t.Errorf("no stream through %s was cut by its kill: the test did not load it", victim.id)
	}

	// The Nodes cancelled the dead Edge's runs at once: every request their
	// servers had from before the kill either completed (an Edge that is
	// left) or was given up within a few seconds of the kill (the dead
	// Edge's: nobody reads them any more), never left to run on.
	cancelled := 0
	for _, n := range nodes {
		for _, r := range fakeRequests(t, n) {
			if r.Start.After(killed) || r.Path != "/api/chat" {
				continue
			}
			if r.End.IsZero() || (!r.GoneAt.IsZero() && r.GoneAt.Sub(killed) > 3*time.Second) {
				t.Errorf("node %s: a run in flight at the kill ended %v after it (gone %v): want cancelled within 3s",
					n.id, r.End.Sub(killed), r.GoneAt.Sub(killed))
			}
			if !r.GoneAt.IsZero() {
				cancelled++
				t.Logf("cluster figure: node %s cancelled a run of the dead Edge %.2fs after the kill", n.id, r.GoneAt.Sub(killed).Seconds())
			}
		}
		// Counted on the Node's model server: never more than its capacity.
		// A run the Node cancelled frees its slot once the Node has closed
		// its connection; the fake's handler notices the close a scheduling
		// delay later, which under load can overlap the next run's start by
		// milliseconds (seen in .ci/run: "3 at once" from a cancelled run).
		// So overlaps are counted from the fake's records, less noticeGrace
		// at each end; an Edge oversubscribing would overlap by seconds.
		var conc fakeollama.Concurrency
		getJSON(t, n.url+"/_fake/concurrency", &conc)
		most := mostAtOnce(fakeRequests(t, n), noticeGrace)
		t.Logf("cluster figure: node %s ran at most %d at once (capacity %d; the fake's own count, with no grace: %d)", n.id, most, clusterCapacity, conc.Max)
		if most > clusterCapacity {
			t.Errorf("node %s ran %d at once, over its capacity %d, with three Edges dispatching", n.id, most, clusterCapacity)
		}
	}
	if cancelled == 0 {
		t.Errorf("no run of the killed %s was in flight on a Node: the test did not load it", victim.id)
	}
	// The Edges left see the dead one gone.
	c.checkMembers(c.edge("edge-a"), []string{"edge-a", "edge-b"})
}

// noticeGrace is how long after a Node closed a run's connection the fake
// may still be counted as serving it (mostAtOnce).
const noticeGrace = 100 * time.Millisecond

// mostAtOnce is the most generation requests of rs that were served at
// once, each from its start to its end (or its client's going, if
// earlier) less grace, so that a server's delay in noticing a closed
// connection is not counted as more work at once.
func mostAtOnce(rs []fakeollama.Request, grace time.Duration) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var es []edge
	for _, r := range rs {
		if r.Path != "/api/chat" && r.Path != "/api/generate" {
			continue
		}
		end := r.End
		if !r.GoneAt.IsZero() && (end.IsZero() || r.GoneAt.Before(end)) {
			end = r.GoneAt
		}
		if end.IsZero() {
			end = time.Now()
		}
		if end = end.Add(-grace); !end.After(r.Start) {
			continue
		}
		es = append(es, edge{r.Start, 1}, edge{end, -1})
	}
	slices.SortFunc(es, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // an end before a start at the same instant
	})
	most, now := 0, 0
	for _, e := range es {
		now += e.delta
		most = max(most, now)
	}
	return most
}

func resetFake(t *testing.T, n *clusterNode) {
	t.Helper()
	resp, err := http.Post(n.url+"/_fake/reset", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

func fakeRequests(t *testing.T, n *clusterNode) []fakeollama.Request {
	t.Helper()
	var rs []fakeollama.Request
	getJSON(t, n.url+"/_fake/requests", &rs)
	return rs
}

// databaseStopped: with the database stopped, requests through the Edges
// left are served, a join is refused with its reason, and the usage of
// what was served reaches the ledger once the database is back.
func (c *testCluster) databaseStopped(t *testing.T, pg *pgtest.Server) {
	a, b := c.edge("edge-a"), c.edge("edge-b")
	before := usageRequests(t, a)
	pg.Stop(t)
	stopped := time.Now()
	served := 0
	for time.Since(stopped) < outage {
		for _, e := range []*clusterEdge{a, b} {
			if r := c.stream(e, openAI, nil); !r.done {
				t.Errorf("with the database stopped, a request through %s: %v", e.id, r)
			} else {
				served++
			}
		}
	}
	out, err := run(t, c.dir, bin.edged, "node", "add", "n8", "--config", a.conf)
	if err == nil || !strings.Contains(out, "database") {
		t.Errorf("edged node add with the database stopped: err %v, want refused naming the database:\n%s", err, out)
	}
	pg.Start(t)
	back := time.Now()
	var after int64
	if !waitCond(30*time.Second, func() bool { after = usageRequests(t, a); return after >= before+int64(served) }) {
		t.Errorf("the ledger after the outage: %d requests, want at least %d (%d before, %d served during the outage)", after, before+int64(served), before, served)
	}
	t.Logf("cluster figure: database stopped %v: %d requests served meanwhile; ledger caught up %.1fs after it was back",
		back.Sub(stopped).Round(time.Second), served, time.Since(back).Seconds())
}

// outage is how long DatabaseStopped keeps the database down.
var outage = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("IOP_CLUSTER_OUTAGE")); err == nil {
		return d
	}
	return time.Minute
}()

// usageRequests is the cluster's ledger total of requests, through e.
func usageRequests(t *testing.T, e *clusterEdge) int64 {
	t.Helper()
	var rep struct {
		Total struct {
			Requests int64 `json:"requests"`
		} `json:"total"`
	}
	if code := getJSON(t, e.base+"/admin/v1/usage?by=", &rep); code != http.StatusOK {
		return -1
	}
	return rep.Total.Requests
}

// removeFencesEverywhere: `edged node remove` on edge-a fences the Node's
// connection on edge-b within 2 s.
func (c *testCluster) removeFencesEverywhere(t *testing.T, n *clusterNode) {
	a, b := c.edge("edge-a"), c.edge("edge-b")
	c.waitReadyOn(n.id, a)
	c.waitReadyOn(n.id, b)
	removed := time.Now()
	if out, err := run(t, c.dir, bin.edged, "node", "remove", n.id, "--config", a.conf); err != nil {
		t.Fatalf("edged node remove %s: %v\n%s", n.id, err, out)
	}
	for _, e := range []*clusterEdge{a, b} {
		ok := waitCond(10*time.Second, func() bool {
			v, ok := c.viewOn(e, n.id)
			return ok && v.State == "fenced"
		})
		took := time.Since(removed)
		if !ok {
			t.Errorf("%s removed on edge-a is not fenced on %s", n.id, e.id)
			continue
		}
		t.Logf("cluster figure: node remove on edge-a fenced %s on %s within %.2fs", n.id, e.id, took.Seconds())
		if took > 2*time.Second {
			t.Errorf("%s fenced on %s %.2fs after the removal on edge-a, want within 2s", n.id, e.id, took.Seconds())
		}
	}
}

// plannedStopDrains: SIGTERM to edge-b while it carries a stream: new
// requests through it are refused 503 edge_stopping with Retry-After, the
// stream completes, edged exits, and the Node is still served by edge-a.
func (c *testCluster) plannedStopDrains(t *testing.T) {
	a, b := c.edge("edge-a"), c.edge("edge-b")
	first := make(chan struct{})
	result := make(chan streamResult, 1)
	go func() { result <- c.stream(b, openAI, first) }()
	<-first
	_ = b.proc.cmd.Process.Signal(syscall.SIGTERM)
	if !waitCond(10*time.Second, func() bool { return httpStatus(t, b.base+"/readyz") == http.StatusServiceUnavailable }) {
		t.Errorf("edge-b's /readyz while it stops: not 503")
	}
	r := c.stream(b, openAI, nil)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.errMsg, "edge_stopping") {
		t.Errorf("a new request through the stopping edge-b: %v; want 503 edge_stopping", r)
	}
	if got := <-result; !got.done {
		t.Errorf("the stream edge-b carried when told to stop: %v; want it completed", got)
	}
	select {
	case <-b.proc.done:
	case <-time.After(30 * time.Second):
		t.Errorf("edge-b still running 30s after its last stream ended")
	}
	b.dead.Store(true)
	if r := c.stream(a, openAI, nil); !r.done {
		t.Errorf("through edge-a after edge-b stopped: %v", r)
	}
}
