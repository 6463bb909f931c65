//go:build unix

package registrar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The tests below that need another user run as root (as CI does) and
// start this test binary again as uid 65534 (nobody) with helperEnv set;
// init turns it into that user's side.

const (
	otherUID  = 65534
	helperEnv = "IOP_REGISTRAR_SOCKET_HELPER"
)

func init() {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		return
	}
	dir := os.Args[1]
	switch mode {
	case "serve": // a listener of this user's, answering every command with success
		ln, err := net.Listen("unix", filepath.Join(dir, SocketFile))
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println("listening")
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Println("served", r.Method, r.URL.Path)
			_, _ = w.Write([]byte("[]"))
		}))
	case "hang": // a caller of this user's that connects and sends nothing
		c, err := net.Dial("unix", filepath.Join(dir, SocketFile))
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println("connected")
		_, _ = c.Read(make([]byte, 1)) // until the Edge hangs up
		fmt.Println("hung up")
	case "call": // a client of this user's
		_, err := NewSocketClient(dir).AddToken("intruder", time.Hour)
		fmt.Println("result:", err)
	}
	os.Exit(0)
}

// asOtherUser is this test binary, run as uid 65534 in mode on dir. It
// skips t unless it runs as root on Linux.
func asOtherUser(t *testing.T, mode, dir string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 || runtime.GOOS != "linux" {
		t.Skip("needs root on Linux: the other user is a real uid (65534), and only root can switch to it")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// go test builds the binary in a directory only its user can enter.
	exeDir, err := os.MkdirTemp("", "iop-registrar-helper-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(exeDir) })
	mustChmod(t, exeDir, 0o755)
	exe := filepath.Join(exeDir, "helper")
	if os.Link(self, exe) != nil {
		b, err := os.ReadFile(self)
		if err == nil {
			err = os.WriteFile(exe, b, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(exe, dir)
	cmd.Env = []string{helperEnv + "=" + mode}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: otherUID, Gid: otherUID}}
	return cmd
}

func mustChmod(t *testing.T, path string, m os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, m); err != nil {
		t.Fatal(err)
	}
}

// otherUserDir is a new directory that uid 65534 can enter (and, with
// mode 0777, write).
func otherUserDir(t *testing.T, m os.FileMode) string {
	t.Helper()
	dir := t.TempDir()
	mustChmod(t, filepath.Dir(dir), 0o711)
	mustChmod(t, dir, m)
	return dir
}

// socketRecorder is a fake Edge that counts what it was asked.
type socketRecorder struct{ n atomic.Int32 }

func (r *socketRecorder) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	r.n.Add(1)
	_, _ = w.Write([]byte("[]"))
}

func serveRecorder(t *testing.T, ln net.Listener) *socketRecorder {
	t.Helper()
	rec := &socketRecorder{}
	srv := &http.Server{Handler: rec}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	return rec
}

// Issue 24, gap 2: a socket file of another user in place of admin.sock
// is not the caller's Edge: nothing is sent to it, and the error says
// whose it is and what to do.
func TestTheClientRefusesASocketFileOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: only root can give a socket file to another user")
	}
	dir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(dir, SocketFile))
	if err != nil {
		t.Fatal(err)
	}
	rec := serveRecorder(t, ln)
	if err := os.Lchown(filepath.Join(dir, SocketFile), otherUID, otherUID); err != nil {
		t.Fatal(err)
	}
	_, err = NewSocketClient(dir).List()
	if !errors.Is(err, ErrUntrustedSocket) {
		t.Fatalf("List: %v, want ErrUntrustedSocket", err)
	}
	for _, want := range []string{filepath.Join(dir, SocketFile), "owned by uid 65534", "nothing was sent"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	if n := rec.n.Load(); n != 0 {
		t.Errorf("%d requests reached the socket", n)
	}
}

// Issue 24, gap 2: the file alone is not trusted: a socket whose file
// belongs to root but whose listener runs as another user is refused too
// (the kernel names the listener's user: SO_PEERCRED).
func TestTheClientRefusesAListenerOfAnotherUser(t *testing.T) {
	dir := otherUserDir(t, 0o777)
	cmd := asOtherUser(t, "serve", dir)
	out := &helperOutput{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitSocket(t, "the other user's listener", func() bool { return strings.Contains(out.String(), "listening") })
	if err := os.Lchown(filepath.Join(dir, SocketFile), 0, 0); err != nil {
		t.Fatal(err)
	}
	_, err := NewSocketClient(dir).Remove("gpu-1")
	if !errors.Is(err, ErrUntrustedSocket) || !strings.Contains(err.Error(), "served by a process of uid 65534") {
		t.Fatalf("Remove: %v, want ErrUntrustedSocket naming the listener's uid", err)
	}
	if strings.Contains(out.String(), "served") {
		t.Errorf("the request reached the other user's listener:\n%s", out)
	}
}

// Issue 24, gap 2: the Edge's socket opened to others by mistake (mode
// 0666 in a directory they can enter) still serves only the Edge's user
// and root: another user's call is refused with the reason, and counted.
func TestTheEdgeRefusesACallerOfAnotherUser(t *testing.T) {
	f := newFixture(t)
	cmd := asOtherUser(t, "call", f.dir)
	mustChmod(t, filepath.Dir(f.dir), 0o711)
	mustChmod(t, f.dir, 0o711)
	ln, err := ListenSocket(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int32
	ln.Refused = func(uid int) {
		if uid == otherUID {
			refused.Add(1)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { f.svc.ServeSocket(ctx, ln, f.svc.log) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	mustChmod(t, filepath.Join(f.dir, SocketFile), 0o666)

	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the other user's call: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "you are uid 65534") || !strings.Contains(string(out), "run edged node commands as root") {
		t.Errorf("the other user was told: %s", out)
	}
	if n := refused.Load(); n != 1 {
		t.Errorf("%d refusals counted, want 1", n)
	}
	list, err := NewSocketClient(f.dir).List()
	if err != nil || len(list) != 0 {
		t.Errorf("the Edge's own user lists %+v %v, want nothing (no token for the intruder)", list, err)
	}
}

// A caller of another user that sends nothing holds a refusal for at most
// refuseWithin, and none past the listener's Close.
func TestClosingTheSocketCutsRefusalsShort(t *testing.T) {
	dir := otherUserDir(t, 0o711)
	cmd := asOtherUser(t, "hang", dir)
	ln, err := ListenSocket(dir)
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan int, 1)
	ln.Refused = func(uid int) { refused <- uid }
	accepted := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		accepted <- err
	}()
	mustChmod(t, filepath.Join(dir, SocketFile), 0o666)
	out := &helperOutput{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	select {
	case uid := <-refused:
		if uid != otherUID {
			t.Fatalf("refused uid %d", uid)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the other user's connection was not refused:\n%s", out)
	}
	start := time.Now()
	ln.Close()
	if d := time.Since(start); d >= refuseWithin {
		t.Errorf("Close took %s: it waited out the refusal", d)
	}
	if err := <-accepted; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v", err)
	}
	waitSocket(t, "the refused caller to be hung up on", func() bool { return strings.Contains(out.String(), "hung up") })
}

// What is not a socket (a link to one elsewhere, a file) is not the Edge's.
func TestTheClientRefusesWhatIsNotASocket(t *testing.T) {
	dir, elsewhere := t.TempDir(), t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(elsewhere, SocketFile))
	if err != nil {
		t.Fatal(err)
	}
	rec := serveRecorder(t, ln)
	if err := os.Symlink(filepath.Join(elsewhere, SocketFile), filepath.Join(dir, SocketFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := NewSocketClient(dir).List(); !errors.Is(err, ErrUntrustedSocket) || !strings.Contains(err.Error(), "is not a socket") {
		t.Errorf("a link: %v", err)
	}
	if rec.n.Load() != 0 {
		t.Error("the request went through the link")
	}
}

type helperOutput struct {
	mu sync.Mutex
	b  strings.Builder
}

func (o *helperOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *helperOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// waitSocket polls cond for up to 10 s.
func waitSocket(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
