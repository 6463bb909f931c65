package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/internal/pgtest"
)

// TestClusterBench is issue 22's benchmark, on TestCluster's harness (a
// real PostgreSQL, edged on the host, each noded in a network namespace of
// its own). It measures, never asserts: a figure is only compared with the
// same load sent straight to the model servers in the same run, and the
// test fails only when a request does. Two parts:
//
//  1. Clients spread over one, two and three Edges of one three-Edge
//     cluster in front of two Nodes (after one client alone through one
//     Edge, the path without contention): benchClients concurrent streaming
//     clients of Ollama's /api/chat, round-robin over the Edges, each
//     benchRequests answers of benchModel; beside the same load straight
//     to the two fake Ollamas ("direct"), measured just before. Tokens/s is
//     every token over the wall time; TTFB is request sent → first token;
//     CPU per token is what the three edged and two noded used meanwhile
//     (the raw tunnel /api/chat takes does not cross the Nodes' plugins).
//  2. What a Node's connections to more Edges cost, idle: a Node whose
//     cluster is one Edge beside a Node of the three-Edge cluster, side by
//     side over the same window: noded's resident set (VmRSS, averaged over
//     the window) and the packets and bytes on its namespace's veth (both
//     ways, per second and per Edge connection).
//
// It runs real daemons for a few minutes, so it is skipped unless asked
// for (as root, like the fault suite):
//
//	IOP_CLUSTER_BENCH=1 go test -run TestClusterBench -v -timeout 20m ./integration/
//
// The tables are the log lines prefixed "cluster bench:".
func TestClusterBench(t *testing.T) {
	if os.Getenv("IOP_CLUSTER_BENCH") != "1" {
		t.Skip("the cluster benchmark runs with IOP_CLUSTER_BENCH=1")
	}
	requireNetns(t)
	pg := pgtest.NewServer(t)
	three := newTestCluster(t, pg.CreateDatabase(t), "edge-a", "edge-b", "edge-c")
	one := newTestCluster(t, pg.CreateDatabase(t), "solo")

	// Part 2 first, on a machine no load of this test disturbs.
	idle1 := one.join("idle1", "solo")
	idle3 := three.join("idle3", "edge-a")
	one.waitReadyOn(idle1.id, one.edges[0])
	for _, e := range three.edges {
		three.waitReadyOn(idle3.id, e)
	}
	idleCost(t, []idleNode{{idle1, 1}, {idle3, 3}})

	b1 := three.benchNode("b1", "edge-a")
	b2 := three.benchNode("b2", "edge-b")
	direct := []string{b1.url, b2.url}
	var edges []string
	relays := []int{b1.proc.cmd.Process.Pid, b2.proc.cmd.Process.Pid}
	for _, e := range three.edges {
		edges = append(edges, e.base)
		relays = append(relays, e.proc.cmd.Process.Pid)
	}
	logBench(t, fmt.Sprintf("clients of Ollama's /api/chat, answers of %d tokens %v apart; two Nodes of capacity %d; "+
		"direct = the same clients straight to the Nodes' fake Ollamas, just before",
		benchModel.TokenCount, benchModel.TokenDelay, benchCapacity))
	logBench(t, "| Edges | clients × answers | tokens/s direct | tokens/s via Edges | ratio | TTFB p50 direct / via / added | TTFB p99 direct / via / added | CPU per token |")
	logBench(t, "|---|---|---|---|---|---|---|---|")
	row := func(k int, l clientLoad) {
		d := l.run(t, direct, nil)
		v := l.run(t, edges[:k], relays)
		dp50, dp99 := d.percentiles()
		vp50, vp99 := v.percentiles()
		logBench(t, fmt.Sprintf("| %d | %d × %d | %.0f | %.0f | %.3f | %s / %s / %s | %s / %s / %s | %.1f µs |", k, l.clients, l.requests,
			d.rate(), v.rate(), v.rate()/d.rate(),
			benchMS(dp50), benchMS(vp50), benchMS(vp50-dp50), benchMS(dp99), benchMS(vp99), benchMS(vp99-dp99),
			float64(v.cpu.Microseconds())/float64(v.tokens)))
	}
	// One client alone first: the path's own latency, without contention.
	row(1, clientLoad{clients: 1, requests: 20})
	for k := 1; k <= len(edges); k++ {
		row(k, clientLoad{clients: benchClients, requests: benchRequests})
	}
	logBench(t, "CPU per token: utime+stime of the three edged and the two noded over the counted requests, per token relayed")
}

// benchModel answers 200 tokens 5 ms apart: about a second per answer, as
// iopbench's streams.
var benchModel = fakeollama.Model{Name: "bench:latest", TokenCount: 200, TokenDelay: 5 * time.Millisecond, Seed: 1}

const (
	benchClients  = 32
	benchRequests = 10
	// benchCapacity is each bench Node's capacity: more than the clients,
	// so that no request waits for a slot.
	benchCapacity = 64
	// idleWindow is how long the idle Nodes are watched: a whole heartbeat
	// period of either side (30 s), so that each is counted.
	idleWindow = 30 * time.Second
)

func logBench(t *testing.T, line string) {
	t.Helper()
	t.Logf("cluster bench: %s", line)
}

func benchMS(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

// benchNode joins a Node as join does, then gives its fake Ollama
// benchModel and restarts its noded with benchCapacity (join runs it with
// TestCluster's small capacity), and waits until every Edge offers the
// model on it.
func (c *testCluster) benchNode(id, edgeID string) *clusterNode {
	t := c.t
	t.Helper()
	n := c.join(id, edgeID)
	m, _ := json.Marshal(benchModel)
	req, _ := http.NewRequest(http.MethodPut, n.url+"/_fake/models", bytes.NewReader(m))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("PUT %s/_fake/models: %v", n.url, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT %s/_fake/models: %s", n.url, resp.Status)
	}
	// A noded stopped before it has set up its signal handling dies of the
	// signal: it is stopped once ready.
	for _, e := range c.edges {
		c.waitReadyOn(id, e)
	}
	n.proc.stop()
	conf := filepath.Join(n.dir, "cluster-node.yaml")
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	old := fmt.Sprintf("capacity: %d,", clusterCapacity)
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("%s has no %q to raise:\n%s", conf, old, b)
	}
	writeFile(t, conf, strings.Replace(string(b), old, fmt.Sprintf("capacity: %d,", benchCapacity), 1))
	n.proc = n.ns.start(t, "noded "+id, bin.noded, "run", "--config", conf)
	for _, e := range c.edges {
		waitNode(t, e.base, id, "ready with "+benchModel.Name+" on "+e.id, func(v nodeView) bool {
			for _, p := range v.Providers {
				if v.State == "ready" && slices.Contains(p.Targets, benchModel.Name) {
					return true
				}
			}
			return false
		})
	}
	return n
}

// loadFigures is what the clients of one load saw.
type loadFigures struct {
	tokens int
	wall   time.Duration
	ttfbs  []time.Duration
	cpu    time.Duration // used by the watched processes meanwhile
}

func (f loadFigures) rate() float64 { return float64(f.tokens) / f.wall.Seconds() }

// percentiles are the p50 and p99 TTFB, taken as BenchmarkNormalizedPath
// takes them.
func (f loadFigures) percentiles() (p50, p99 time.Duration) {
	s := slices.Clone(f.ttfbs)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)*99/100]
}

// clientLoad is a number of concurrent clients, each streaming a number
// of answers one after the other.
type clientLoad struct{ clients, requests int }

// run runs l's clients, client i on bases[i%len(bases)], each its requests
// one after the other, after one answer each that warms the connections
// and is not counted. Client i starts i/clients of an answer's length
// after the first, so that the tokens of the streams do not all fall due
// at the same instant. Any failed request
// fails the test: a figure with errors in it would flatter the relay.
// The CPU the processes watch used over the counted requests is added up.
func (l clientLoad) run(t *testing.T, bases []string, watch []int) loadFigures {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: l.clients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Minute}
	answer := time.Duration(benchModel.TokenCount) * benchModel.TokenDelay

	var (
		mu   sync.Mutex
		figs loadFigures
		errs []error
	)
	each := func(counted bool) {
		var wg sync.WaitGroup
		for i := range l.clients {
			wg.Go(func() {
				time.Sleep(answer * time.Duration(i) / time.Duration(l.clients))
				n := 1
				if counted {
					n = l.requests
				}
				for range n {
					ttfb, tokens, err := benchStream(client, bases[i%len(bases)])
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					} else if counted {
						figs.tokens += tokens
						figs.ttfbs = append(figs.ttfbs, ttfb)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	each(false)
	cpu0 := cpuTime(t, watch)
	start := time.Now()
	each(true)
	figs.wall = time.Since(start)
	figs.cpu = cpuTime(t, watch) - cpu0
	if len(errs) > 0 {
		t.Fatalf("%d requests to %v failed, the first: %v", len(errs), bases, errs[0])
	}
	return figs
}

// benchStream streams one answer of benchModel from base's /api/chat and
// returns its TTFB (request sent → first token line) and its tokens.
// Lines are classified by substring, as iopbench does, to keep the
// client's CPU small beside the relays'.
func benchStream(c *http.Client, base string) (time.Duration, int, error) {
	body := `{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	start := time.Now()
	resp, err := c.Post(base+"/api/chat", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return 0, 0, fmt.Errorf("%s: %s %s", base, resp.Status, bytes.TrimSpace(b))
	}
	var (
		ttfb   time.Duration
		tokens int
	)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case bytes.Contains(line, []byte(`"done":false`)):
			if tokens == 0 {
				ttfb = time.Since(start)
			}
			tokens++
		case bytes.Contains(line, []byte(`"done":true`)):
			if tokens != benchModel.TokenCount {
				return 0, 0, fmt.Errorf("%s: %d tokens, want %d", base, tokens, benchModel.TokenCount)
			}
			_, err := io.Copy(io.Discard, resp.Body)
			return ttfb, tokens, err
		case bytes.Contains(line, []byte(`"error"`)):
			return 0, 0, fmt.Errorf("%s: error line %s", base, line)
		}
	}
	return 0, 0, errors.Join(fmt.Errorf("%s: the stream ended after %d tokens without done", base, tokens), sc.Err())
}

// idleNode is a Node watched idle, with the number of Edges it is
// connected to.
type idleNode struct {
	n     *clusterNode
	edges int
}

// idleCost watches the Nodes side by side, idle, after a settle of 10 s:
// noded's VmRSS sampled every 5 s over idleWindow and averaged, and the
// packets and bytes both ways on the host end of each Node's veth over the
// window (everything the Node sends or receives crosses it; its fake
// Ollama is reached on the namespace's loopback). Per connection is the
// total over the Node's Edges.
func idleCost(t *testing.T, nodes []idleNode) {
	t.Helper()
	time.Sleep(10 * time.Second)
	before := make([]vethCounters, len(nodes))
	rss := make([][]int64, len(nodes))
	sample := func() {
		for i, in := range nodes {
			kb, err := vmRSS(in.n.proc.cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			rss[i] = append(rss[i], kb)
		}
	}
	for i, in := range nodes {
		before[i] = readVeth(t, in.n.ns.hostIf)
	}
	start := time.Now()
	sample()
	for time.Since(start) < idleWindow {
		time.Sleep(5 * time.Second)
		sample()
	}
	span := time.Since(start).Seconds()
	logBench(t, fmt.Sprintf("idle Nodes over %.0f s, side by side; packets and bytes both ways on the Node's veth", span))
	logBench(t, "| Node connected to | noded VmRSS | packets/s | per connection | bytes/s per connection |")
	logBench(t, "|---|---|---|---|---|")
	avg := make([]float64, len(nodes))
	for i, in := range nodes {
		after := readVeth(t, in.n.ns.hostIf)
		var sum int64
		for _, kb := range rss[i] {
			sum += kb
		}
		avg[i] = float64(sum) / float64(len(rss[i])) / 1024
		pps := float64(after.packets-before[i].packets) / span
		bps := float64(after.bytes-before[i].bytes) / span
		logBench(t, fmt.Sprintf("| %d Edge(s) | %.1f MiB | %.2f | %.2f | %.0f |", in.edges, avg[i], pps, pps/float64(in.edges), bps/float64(in.edges)))
	}
	first, last := nodes[0], nodes[len(nodes)-1]
	logBench(t, fmt.Sprintf("noded VmRSS per extra Edge connection: %.2f MiB ((%d-Edge − %d-Edge) / %d)",
		(avg[len(avg)-1]-avg[0])/float64(last.edges-first.edges), last.edges, first.edges, last.edges-first.edges))
}

// vethCounters are an interface's packets and bytes, received and sent
// added together.
type vethCounters struct{ packets, bytes int64 }

func readVeth(t *testing.T, ifname string) vethCounters {
	t.Helper()
	read := func(name string) int64 {
		b, err := os.ReadFile(filepath.Join("/sys/class/net", ifname, "statistics", name))
		if err != nil {
			t.Fatal(err)
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return vethCounters{
		packets: read("rx_packets") + read("tx_packets"),
		bytes:   read("rx_bytes") + read("tx_bytes"),
	}
}

// cpuTime is the utime+stime the processes have used, all their threads
// (the exited ones too), from /proc/PID/stat in clock ticks of 10 ms
// (USER_HZ is 100 on every Linux architecture Go supports).
func cpuTime(t *testing.T, pids []int) time.Duration {
	t.Helper()
	var sum time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		// After the ')' that ends the command: state is field 0, utime 11,
		// stime 12.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		ut, err1 := strconv.ParseInt(f[11], 10, 64)
		st, err2 := strconv.ParseInt(f[12], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		sum += time.Duration(ut+st) * 10 * time.Millisecond
	}
	return sum
}

// vmRSS is pid's resident set in KiB.
func vmRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no VmRSS", pid)
}
