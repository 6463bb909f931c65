package integration

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Network namespaces for the fault suite: each Node (noded, its plugin
// processes and its fake Ollama) runs in a namespace of its own, joined to
// the host by a veth pair on a /30 of 10.77.0.0/16. Inside, the fake Ollama
// listens on the namespace's own 127.0.0.1; the Node dials the Edge at the
// host end of the pair.
//
// A partition must be silent both ways, as when a Node's machine drops off
// the network: nothing tells either sender. Taking a veth end down is not
// that: the side whose end is down loses its route, so its sends fail at
// once (the Edge, which sends with the arriving interface pinned, gets
// ENETUNREACH; another sender would take the default route off the host).
// So a cut points each side's neighbour entry for the other at a MAC that
// is nobody's: frames still leave on the veth and the peer drops them as
// addressed to another host. Healing deletes the entries and ARP finds the
// real peer again. The kernel here has no netem, so delay and loss are done
// in userspace instead (udprelay_test.go).

// netns is one namespace and its veth pair.
type netns struct {
	name         string // the namespace
	hostIf, nsIf string // the two ends of the veth pair
	hostIP, nsIP string // their addresses (each a /30)
	t            *testing.T
}

var (
	netnsOnce  sync.Once
	netnsSkip  string
	netnsIndex atomic.Uint32
)

// requireNetns skips the test when namespaces cannot be made here: a short
// run, not root, no `ip`, or a kernel or container that refuses them.
func requireNetns(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("fault suite: skipped in -short mode (it runs real daemons for minutes)")
	}
	netnsOnce.Do(func() {
		switch {
		case os.Geteuid() != 0:
			netnsSkip = "fault suite: network namespaces need root (CI runs as root)"
		default:
			if _, err := exec.LookPath("ip"); err != nil {
				netnsSkip = "fault suite: the `ip` command (iproute2) is missing; .ci/run installs it"
				return
			}
			sweepStaleNetns()
			// One namespace made and removed tells whether this kernel and
			// container allow them at all.
			name := fmt.Sprintf("iopf-%d-probe", os.Getpid())
			if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
				netnsSkip = fmt.Sprintf("fault suite: cannot create a network namespace here: %v: %s", err, out)
				return
			}
			exec.Command("ip", "netns", "del", name).Run()
		}
	})
	if netnsSkip != "" {
		t.Skip(netnsSkip)
	}
}

// sweepStaleNetns removes the namespaces of test binaries that died
// without cleaning up (a -timeout panic runs no cleanup): each name carries
// the pid of the binary that made it. What still runs inside is killed.
func sweepStaleNetns() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		var pid int
		if _, err := fmt.Sscanf(name, "iopf-%d-", &pid); err != nil || pid <= 0 {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue // its test binary is still running
		}
		ns := &netns{name: name}
		for _, p := range ns.pids() {
			syscall.Kill(p, syscall.SIGKILL)
		}
		exec.Command("ip", "netns", "del", name).Run()
	}
}

func randomSuffix() string {
	b := make([]byte, 3)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// newNetns makes a namespace joined to the host by a veth pair, with lo up
// inside. Everything is removed at the end of the test, failed or not:
// every process left in the namespace is killed first.
func newNetns(t *testing.T) *netns {
	t.Helper()
	requireNetns(t)
	sfx := randomSuffix()
	// 10.77.N.0/30 with N unique in this test binary; the base is random so
	// that two test binaries at once rarely meet, and a subnet already on
	// the host is skipped.
	var n uint32
	for {
		n = (netnsIndex.Add(1) + netnsBase) % 250
		if !hostHasAddr(fmt.Sprintf("10.77.%d.", n+1)) {
			break
		}
	}
	ns := &netns{
		name:   fmt.Sprintf("iopf-%d-%s", os.Getpid(), sfx),
		hostIf: "iopf" + sfx + "h", // interface names are at most 15 bytes
		nsIf:   "iopf" + sfx + "n",
		hostIP: fmt.Sprintf("10.77.%d.1", n+1),
		nsIP:   fmt.Sprintf("10.77.%d.2", n+1),
		t:      t,
	}
	// Registered before anything exists, so a half-made namespace goes too;
	// it runs after the cleanups of processes started later (LIFO).
	t.Cleanup(ns.remove)
	steps := [][]string{
		{"netns", "add", ns.name},
		{"link", "add", ns.hostIf, "type", "veth", "peer", "name", ns.nsIf},
		{"link", "set", ns.nsIf, "netns", ns.name},
		{"addr", "add", ns.hostIP + "/30", "dev", ns.hostIf},
		{"link", "set", ns.hostIf, "up"},
		{"-n", ns.name, "addr", "add", ns.nsIP + "/30", "dev", ns.nsIf},
		{"-n", ns.name, "link", "set", ns.nsIf, "up"},
		{"-n", ns.name, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	return ns
}

var netnsBase = uint32(os.Getpid()) % 250

func hostHasAddr(prefix string) bool {
	out, _ := exec.Command("ip", "-4", "-o", "addr", "show").Output()
	return strings.Contains(string(out), " "+prefix)
}

// start runs a daemon inside the namespace (`ip netns exec` execs it, so
// the process is the daemon itself and signals reach it directly).
func (ns *netns) start(t *testing.T, name, path string, args ...string) *proc {
	t.Helper()
	return start(t, name, "ip", append([]string{"netns", "exec", ns.name, path}, args...)...)
}

// nobody is a locally administered MAC that no interface here has.
const nobody = "02:00:00:00:00:01"

// cut partitions the namespace from the host, silently both ways.
func (ns *netns) cut() {
	ns.t.Helper()
	ns.ip("neigh", "replace", ns.nsIP, "lladdr", nobody, "dev", ns.hostIf, "nud", "permanent")
	ns.ip("-n", ns.name, "neigh", "replace", ns.hostIP, "lladdr", nobody, "dev", ns.nsIf, "nud", "permanent")
}

// heal ends the partition.
func (ns *netns) heal() {
	ns.t.Helper()
	ns.ip("neigh", "del", ns.nsIP, "dev", ns.hostIf)
	ns.ip("-n", ns.name, "neigh", "del", ns.hostIP, "dev", ns.nsIf)
}

// downHost takes the host end of the veth down: the host loses its route to
// the namespace, so the Edge's sends fail at once with ENETUNREACH (a flap
// of the Edge's own interface), while the Node's sends vanish silently.
func (ns *netns) downHost() {
	ns.t.Helper()
	ns.ip("link", "set", ns.hostIf, "down")
}

// upHost brings the host end back up, and with it the route.
func (ns *netns) upHost() {
	ns.t.Helper()
	ns.ip("link", "set", ns.hostIf, "up")
}

func (ns *netns) ip(args ...string) {
	ns.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		ns.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// pids lists the processes in the namespace.
func (ns *netns) pids() []int {
	out, err := exec.Command("ip", "netns", "pids", ns.name).Output()
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids
}

// remove kills what is left in the namespace (orphaned plugin processes
// included) and deletes the veth pair and the namespace.
func (ns *netns) remove() {
	t := ns.t
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := ns.pids()
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			t.Errorf("namespace %s: processes %v survive SIGKILL", ns.name, pids)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Deleting the host end deletes its peer; the namespace goes last.
	if out, err := exec.Command("ip", "link", "del", ns.hostIf).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find device") {
		t.Errorf("ip link del %s: %v: %s", ns.hostIf, err, out)
	}
	if out, err := exec.Command("ip", "netns", "del", ns.name).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
		t.Errorf("ip netns del %s: %v: %s", ns.name, err, out)
	}
}
