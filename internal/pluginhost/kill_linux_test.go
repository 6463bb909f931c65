package pluginhost_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"
)

// processGone reports whether pid has exited (a zombie nobody reaped
// counts as gone).
func processGone(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	// The state follows the command name in parentheses: "pid (comm) S ...".
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] == 'Z' || stat[i+2] == 'X'
	}
	return false
}

// Killing a Node with SIGKILL leaves no plugin behind: the host starts
// plugins with a parent-death signal.
func TestKilledHostTakesItsPluginWithIt(t *testing.T) {
	helper, pid := startHelper(t, "host")
	if processGone(pid) {
		t.Fatal("the plugin is not running")
	}
	began := time.Now()
	if err := helper.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the plugin to die with its host", 3*time.Second, func() bool { return processGone(pid) })
	t.Logf("plugin gone %v after its host was killed", time.Since(began))
}

// A plugin whose parent dies exits by itself (sdk.Serve watches its parent
// pid), even when nothing asked the kernel to kill it.
func TestPluginExitsWhenItsParentIsGone(t *testing.T) {
	helper, pid := startHelper(t, "raw")
	time.Sleep(200 * time.Millisecond) // let the adapter start serving
	if processGone(pid) {
		t.Fatal("the plugin is not running")
	}
	if err := helper.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the orphaned plugin to exit", 5*time.Second, func() bool { return processGone(pid) })
}
