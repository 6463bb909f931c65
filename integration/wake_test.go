//go:build linux

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/sys/unix"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// Wake on demand (issue 23; SPEC P4, P7): a Node in a network namespace is
// "asleep" (its noded is not running); a listener inside the namespace,
// standing for its network card, starts noded only when a valid magic
// packet for the namespace's MAC arrives on the wake port. Another Node,
// on the host, has it in its wake list. The sleeping Node was connected
// once, so the Edge knows its model; a request for that model through the
// Ollama API is held while the Edge asks the waker to send the packet,
// the listener starts noded, it registers, and the request is answered;
// the Edge logs the wake time. With no waker connected, a request for the
// model is answered at once with the reason.
func TestASleepingNodeIsWokenByARequestForItsModel(t *testing.T) {
	requireNetns(t)
	began := time.Now()
	f := newFaultFleet(t)

	// The sleeper: noded and its fake Ollama in a namespace of their own.
	sleeper := f.wakeNode(t, "wake-sleeper", newNetns(t), fakeollama.Model{Name: "big:latest", Text: "the woken node answers"}, "")
	ns := sleeper.ns
	mac := nsMAC(t, ns)
	broadcast := lanBroadcast(t, ns)

	// The waker, on the host: on the sleeper's LAN (the host end of its
	// veth), with the sleeper in its wake list.
	waker := f.wakeNode(t, "wake-waker", nil, fakeollama.Model{Name: "small:latest", Text: "the waker answers"},
		fmt.Sprintf("wake:\n  - {node_id: wake-sleeper, mac: %q, broadcast: %q}\n", strings.ToUpper(strings.ReplaceAll(mac.String(), ":", "-")), broadcast))

	// The sleeper goes to sleep: the Edge shows it sleeping, and lists its
	// model as asleep.
	sleeper.proc.stop()
	f.waitWake(t, "wake-sleeper", "sleeping with its waker connected", func(v wakeView) bool {
		return v.State == "sleeping" && len(v.Wakers) == 1 && v.Wakers[0].Node == "wake-waker" && v.Wakers[0].Connected
	})
	if asleep := tagsAsleepOn(t, f.base, "big:latest"); len(asleep) != 1 || asleep[0] != "wake-sleeper" {
		t.Errorf("issue 23: /api/tags lists big:latest asleep on %v, want [wake-sleeper]", asleep)
	}
	// The status page, where there is a browser, shows it sleeping, then
	// waking, then awake.
	var page *browserPage
	if browser := findBrowser(); browser != "" {
		page = newBrowserPage(t, browser, f.base)
		page.open()
		page.waitWakeRow("wake-sleeper", "sleeping")
	} else {
		t.Log("no chromium: the status page's wake section is not checked")
	}

	// Its network card: the first valid magic packet for its MAC on port 9.
	packets := listenForMagic(t, ns, mac, 9)

	asked := time.Now()
	answered := make(chan chatResult, 1)
	go func() { answered <- wakeChat(f.base, "big", 60*time.Second) }()
	var woke time.Time
	select {
	case woke = <-packets:
	case r := <-answered:
		t.Fatalf("issue 23: the request was answered (%d %s) before any magic packet arrived", r.code, r.body)
	case <-time.After(20 * time.Second):
		t.Fatalf("issue 23: no valid magic packet for %s reached the namespace within 20s:\n%s", mac, f.edge.out)
	}
	f.timing("wake: magic packet on the sleeper's LAN %.2fs after the request", woke.Sub(asked).Seconds())
	// The machine takes its time: the Edge shows the Node waking meanwhile.
	f.waitWake(t, "wake-sleeper", "waking", func(v wakeView) bool { return v.State == "waking" })
	if page != nil {
		page.waitWakeRow("wake-sleeper", "waking")
	}
	sleeper.proc = ns.start(t, "noded wake-sleeper (woken)", bin.noded, "run", "--config", sleeper.conf)

	r := <-answered
	if r.code != http.StatusOK || !strings.Contains(r.body, "the woken node answers") {
		t.Fatalf("issue 23: the held request was answered %d: %s", r.code, r.body)
	}
	f.timing("wake: request answered %.2fs after it was sent", time.Since(asked).Seconds())
	line := regexp.MustCompile(`woke node wake-sleeper for model big via node wake-waker in ([0-9.]+)s`)
	m := line.FindStringSubmatch(f.edge.out.String())
	if m == nil {
		t.Fatalf("issue 23: the Edge did not log the wake with its time:\n%s", f.edge.out)
	}
	took, _ := strconv.ParseFloat(m[1], 64)
	f.timing("wake: the Edge logged %q", m[0])
	if took <= 0 || took > time.Since(asked).Seconds()+0.1 {
		t.Errorf("issue 23: wake time %.1fs, want within the request's %.1fs", took, time.Since(asked).Seconds())
	}
	f.waitWake(t, "wake-sleeper", "awake", func(v wakeView) bool { return v.State == "awake" && v.LastWakeMillis > 0 })
	if page != nil {
		page.waitWakeRow("wake-sleeper", "awake")
	}
	if resp, err := adminClient.Get(f.base + "/metrics"); err != nil {
		t.Errorf("GET /metrics: %v", err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), `iop_edge_wakes_total{result="succeeded"} 1`) {
			t.Errorf("issue 23: /metrics does not count the wake as succeeded:\n%s", grepLines(string(b), "iop_edge_wake"))
		}
	}

	// Asleep again, and no waker connected: answered at once, with why.
	sleeper.proc.stop()
	waker.proc.stop()
	f.waitWake(t, "wake-sleeper", "sleeping with no waker connected", func(v wakeView) bool {
		return v.State == "sleeping" && len(v.Wakers) == 1 && !v.Wakers[0].Connected
	})
	asked = time.Now()
	r = wakeChat(f.base, "big", 20*time.Second)
	if r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, "node wake-sleeper is asleep and no connected node can wake it") {
		t.Errorf("issue 23: with no waker connected: %d %s, want 503 saying the Node is asleep and nobody can wake it", r.code, r.body)
	}
	if d := time.Since(asked); d > 5*time.Second {
		t.Errorf("issue 23: with no waker connected the request took %v, want an answer at once", d)
	}
	f.timing("wake: the whole scenario took %.1fs", time.Since(began).Seconds())
}

// wakeNode starts a Node serving model on a fake Ollama: in ns, or on the
// host when ns is nil; extra is appended to its configuration. It waits
// until the Node is ready.
func (f *faultFleet) wakeNode(t *testing.T, id string, ns *netns, model fakeollama.Model, extra string) *faultNode {
	t.Helper()
	if out, err := run(t, f.dir, bin.edged, "tls", "cert", "create", "--node", id); err != nil {
		t.Fatalf("edged tls cert create --node %s: %v\n%s", id, err, out)
	}
	n := &faultNode{id: id, ns: ns}
	edgeAddr := fmt.Sprintf("127.0.0.1:%d", f.quicPort)
	if ns != nil {
		edgeAddr = fmt.Sprintf("%s:%d", ns.hostIP, f.quicPort)
	}
	models, _ := json.Marshal([]fakeollama.Model{model})
	modelsFile := filepath.Join(f.dir, id+"-models.json")
	writeFile(t, modelsFile, string(models))
	fake, err := fakeBin()
	if err != nil {
		t.Fatal(err)
	}
	n.fake = n.start(t, "fakeollama "+id, fake, "-addr", "127.0.0.1:0", "-models", modelsFile)
	fakeURL := n.fake.waitOutput(regexp.MustCompile(`listening on (http://\S+)`))
	n.conf = filepath.Join(f.dir, id+".yaml")
	writeFile(t, n.conf, fmt.Sprintf(`node_id: %[1]s
edge: {address: %[2]q}
identity: {mode: mtls, trust_domain: iop.test, edge_id: edge-1, ca_file: iop-ca.pem, cert_file: node-%[1]s.pem, key_file: node-%[1]s-key.pem}
lease_key_file: node-%[1]s-lease.key
drain_timeout: 5s
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
providers:
  - {name: ollama, adapter: ollama, capacity: 2, idle_stop: 0s, targets: [%[3]q], config: {base_url: %[4]q}}
`, id, edgeAddr, model.Name, fakeURL)+extra)
	f.nodes[id] = n
	f.startNode(id, "noded "+id)
	t.Cleanup(func() { f.edge.cmd.Process.Kill() }) // the Edge goes before the namespaces
	f.mustWait(id, "ready", 30*time.Second, func(v faultView) bool { return v.State == "ready" && v.allOnline(1) })
	return n
}

// wakeView is a Node of /admin/v1/wake.
type wakeView struct {
	Node   string `json:"node"`
	State  string `json:"state"`
	Wakers []struct {
		Node      string `json:"node"`
		Connected bool   `json:"connected"`
	} `json:"wakers"`
	LastWakeMillis int64 `json:"last_wake_ms"`
}

// waitWake polls /admin/v1/wake until node's entry satisfies cond.
func (f *faultFleet) waitWake(t *testing.T, node, what string, cond func(wakeView) bool) {
	t.Helper()
	var last []wakeView
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := adminClient.Get(f.base + "/admin/v1/wake")
		if err == nil {
			var body struct {
				Nodes []wakeView `json:"nodes"`
			}
			if resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&body) == nil {
				last = body.Nodes
				for _, v := range body.Nodes {
					if v.Node == node && cond(v) {
						resp.Body.Close()
						return
					}
				}
			}
			resp.Body.Close()
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("issue 23: %s was not %s within 20s; /admin/v1/wake: %+v", node, what, last)
}

// waitWakeRow waits until the status page's wake section shows node in
// state.
func (p *browserPage) waitWakeRow(node, state string) {
	p.t.Helper()
	js := fmt.Sprintf(`(() => { const tr = document.querySelector('#wakes tr[data-wake=%q]'); return tr && !document.getElementById('wake').hidden ? tr.dataset.state : ''; })()`, node)
	deadline := time.Now().Add(15 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		cancel()
		if err == nil && got == state {
			return
		}
		last = got
		time.Sleep(50 * time.Millisecond)
	}
	p.shot("wake-" + state)
	p.t.Fatalf("issue 23: the status page did not show %s %s within 15s; it shows %q", node, state, last)
}

// tagsAsleepOn returns the asleep_on of model in the Edge's /api/tags.
func tagsAsleepOn(t *testing.T, base, model string) []string {
	t.Helper()
	resp, err := adminClient.Get(base + "/api/tags")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Models []struct {
			Name     string   `json:"name"`
			AsleepOn []string `json:"asleep_on"`
		} `json:"models"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	for _, m := range body.Models {
		if m.Name == model {
			return m.AsleepOn
		}
	}
	return nil
}

type chatResult struct {
	code int
	body string
}

// wakeChat asks the Edge's Ollama API for one answer of model.
func wakeChat(base, model string, within time.Duration) chatResult {
	req, _ := http.NewRequest(http.MethodPost, base+"/api/chat",
		strings.NewReader(fmt.Sprintf(`{"model":%q,"stream":false,"messages":[{"role":"user","content":"hi"}]}`, model)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: within}).Do(req)
	if err != nil {
		return chatResult{body: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return chatResult{code: resp.StatusCode, body: string(b)}
}

// nsMAC is the MAC of the namespace's end of its veth: its network card.
func nsMAC(t *testing.T, ns *netns) net.HardwareAddr {
	t.Helper()
	out, err := exec.Command("ip", "-n", ns.name, "-o", "link", "show", "dev", ns.nsIf).CombinedOutput()
	if err != nil {
		t.Fatalf("ip link show: %v: %s", err, out)
	}
	m := regexp.MustCompile(`link/ether ([0-9a-f:]{17})`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("no MAC in %s", out)
	}
	mac, err := net.ParseMAC(m[1])
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// lanBroadcast is the broadcast address of the namespace's /30 LAN.
func lanBroadcast(t *testing.T, ns *netns) string {
	t.Helper()
	ip := net.ParseIP(ns.hostIP).To4()
	if ip == nil {
		t.Fatalf("host address %q", ns.hostIP)
	}
	return net.IPv4(ip[0], ip[1], ip[2], ip[3]|3).String()
}

// listenForMagic opens a UDP socket on port inside ns (a socket belongs
// to the network namespace of the thread that makes it) and sends on the
// returned channel the time the first valid magic packet for mac arrives;
// other datagrams are ignored. The socket is closed at the end of the test.
func listenForMagic(t *testing.T, ns *netns, mac net.HardwareAddr, port int) <-chan time.Time {
	t.Helper()
	type opened struct {
		c   *net.UDPConn
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		// The thread enters the namespace to make the socket and goes back
		// before it is unlocked: it may be the process's main thread, and
		// a process whose main thread is in the namespace would be killed
		// with the namespace's processes at the end of the test.
		runtime.LockOSThread()
		home, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			ch <- opened{err: err}
			return
		}
		defer home.Close()
		target, err := os.Open("/run/netns/" + ns.name)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- opened{err: err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- opened{err: fmt.Errorf("setns: %w", err)}
			return
		}
		c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: port})
		if back := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); back == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked, and ends with this goroutine
		ch <- opened{c, err}
	}()
	o := <-ch
	if o.err != nil {
		t.Fatalf("listen on udp port %d in %s: %v", port, ns.name, o.err)
	}
	t.Cleanup(func() { o.c.Close() })
	want := append(bytes.Repeat([]byte{0xff}, 6), bytes.Repeat(mac, 16)...)
	got := make(chan time.Time, 1)
	go func() {
		buf := make([]byte, 1500)
		for {
			n, _, err := o.c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			if bytes.Equal(buf[:n], want) {
				got <- time.Now()
				return
			}
		}
	}()
	return got
}
