package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/registrar"
	"github.com/iop-dev/iop/quicwire/pki"
)

// The data_dir tests (issue 24, gap 2) run the Edge as root, as CI does,
// and a hostile local user as uid 65534 (nobody): this test binary run again
// with attackEnv set, which init below turns into the attack before TestMain
// builds anything.

const (
	hostileUID = 65534
	attackEnv  = "IOP_DATADIR_ATTACK"
)

func init() {
	if attack := os.Getenv(attackEnv); attack != "" {
		if err := runAttack(attack, os.Args[1:]); err != nil {
			fmt.Println("attack failed:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// runAttack is the hostile user's side. Each attack is one the issue saw
// succeed against a world-writable data_dir:
//
//	swap-socket DIR         replace DIR/admin.sock with a listener that answers every
//	                        `edged node` command with success
//	move-store DIR          move DIR/enroll.db aside
//	plant-store DIR NODE CA put a store holding the attacker's join token for NODE in DIR
//	call-socket DIR         ask the Edge on DIR/admin.sock for a join token
func runAttack(attack string, args []string) error {
	dir := args[0]
	switch attack {
	case "swap-socket":
		path := filepath.Join(dir, registrar.SocketFile)
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return err
		}
		ln, err := net.Listen("unix", path)
		if err != nil {
			return err
		}
		_ = os.Chmod(path, 0o666)
		fmt.Println("listening as uid", os.Getuid())
		var mu sync.Mutex
		return http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			fmt.Println("served", r.Method, r.URL.Path)
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			switch {
			case r.Method == http.MethodDelete:
				id := strings.TrimPrefix(r.URL.Path, "/nodes/")
				_ = json.NewEncoder(w).Encode(registrar.RemoveResult{NodeID: id, Revoked: []string{"0badc0de"}, Fenced: true})
			default:
				_, _ = io.WriteString(w, "[]")
			}
		}))
	case "move-store":
		return os.Rename(filepath.Join(dir, registrar.StoreFile), filepath.Join(dir, registrar.StoreFile+".moved"))
	case "plant-store":
		caCert, err := pki.LoadCACert(args[2])
		if err != nil {
			return err
		}
		// The store is made in a directory of the attacker's inside the
		// data_dir, so that the renames below stay on one file system.
		own, err := os.MkdirTemp(dir, ".plant-")
		if err != nil {
			return err
		}
		store, err := registrar.OpenStore(own, time.Second, time.Now())
		if err != nil {
			return err
		}
		res, err := registrar.New(store, registrar.Options{EdgeID: "edge-1", TrustDomain: "iop.test", CACert: caCert}).AddToken(args[1], time.Hour)
		store.Close()
		if err != nil {
			return err
		}
		_ = os.Rename(filepath.Join(dir, registrar.StoreFile), filepath.Join(dir, registrar.StoreFile+".moved"))
		planted, _ := os.ReadDir(own)
		for _, f := range planted { // the store, and whatever the Edge keeps beside it
			if err := os.Rename(filepath.Join(own, f.Name()), filepath.Join(dir, f.Name())); err != nil {
				return err
			}
		}
		fmt.Println("planted token", res.Token)
		return os.Remove(own)
	case "call-socket":
		res, err := registrar.NewSocketClient(dir).AddToken("intruder", time.Hour)
		if err != nil {
			return err
		}
		fmt.Println("got token", res.Token)
		return nil
	}
	return fmt.Errorf("unknown attack %q", attack)
}

// requireRoot skips t unless it runs as root: only root can run a process
// as another user, and the cases need one.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the hostile local user is a real uid (65534) that only root can switch to")
	}
}

var hostileExe struct {
	once sync.Once
	path string
	err  error
}

// hostileBinary is this test binary where uid 65534 can run it: go test
// builds it in a directory only its user can enter.
func hostileBinary(t *testing.T) string {
	t.Helper()
	hostileExe.once.Do(func() {
		self, err := os.Executable()
		if err != nil {
			hostileExe.err = err
			return
		}
		dir := filepath.Join(bin.dir, "hostile")
		if err = os.MkdirAll(dir, 0o755); err == nil {
			err = os.Chmod(bin.dir, 0o711) // removed with bin.dir at the end of the run
		}
		if err != nil {
			hostileExe.err = err
			return
		}
		hostileExe.path = filepath.Join(dir, "attack")
		if os.Link(self, hostileExe.path) != nil {
			var b []byte
			if b, err = os.ReadFile(self); err == nil {
				err = os.WriteFile(hostileExe.path, b, 0o755)
			}
		}
		hostileExe.err = err
	})
	if hostileExe.err != nil {
		t.Fatalf("the hostile helper: %v", hostileExe.err)
	}
	return hostileExe.path
}

// hostileCmd is the hostile helper doing attack as uid 65534.
func hostileCmd(t *testing.T, attack string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(hostileBinary(t), args...)
	cmd.Env = []string{attackEnv + "=" + attack, "PATH=/usr/bin:/bin"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: hostileUID, Gid: hostileUID}}
	return cmd
}

// attack runs the hostile helper to the end and returns what it printed.
func attack(t *testing.T, attack string, args ...string) (string, error) {
	t.Helper()
	out, err := hostileCmd(t, attack, args...).CombinedOutput()
	return string(out), err
}

// startAttack starts a long-running attack and waits until it says it is
// in place.
func startAttack(t *testing.T, attack string, ready *regexp.Regexp, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: "hostile " + attack, cmd: hostileCmd(t, attack, args...), out: new(lockedBuffer), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name, err)
	}
	go func() { p.waitErr = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s output:\n%s", p.name, p.out)
		}
	})
	p.waitOutput(ready)
	return p
}

// reachable lets other users through the directories above e's data_dir
// (search only, no listing), as /var/lib is: what others may do in the
// data_dir itself is then up to its own mode. It returns the data_dir.
func (e *enrollEdge) reachable() string {
	e.t.Helper()
	for _, d := range []string{filepath.Dir(e.dir), e.dir} {
		chmod(e.t, d, 0o711)
	}
	return filepath.Join(e.dir, "data")
}

// refusedStart runs `edged run`, which must exit without serving; it
// returns what the Edge printed.
func (e *enrollEdge) refusedStart(why string) string {
	e.t.Helper()
	e.starts++
	p := start(e.t, fmt.Sprintf("edged (start %d)", e.starts), bin.edged, append([]string{"run", "--config", e.conf}, e.args...)...)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			if p.waitErr == nil {
				e.t.Fatalf("the Edge exited 0 %s:\n%s", why, p.out)
			}
			return p.out.String()
		case <-time.After(20 * time.Millisecond):
		}
		if strings.Contains(p.out.String(), "serving http") {
			e.t.Fatalf("the Edge started %s:\n%s", why, p.out)
		}
	}
	e.t.Fatalf("the Edge neither served nor exited within 30s %s:\n%s", why, p.out)
	return ""
}

// applyFixes runs, as root, each command the Edge's refusal gave as the
// fix (or as the way to start over), and fails unless it gave one.
func applyFixes(t *testing.T, refusal string) {
	t.Helper()
	fixes := regexp.MustCompile(`(?m)^\s*(?:fix|start over): (.+)$`).FindAllStringSubmatch(refusal, -1)
	if len(fixes) == 0 {
		t.Fatalf("the refusal gives no fix:\n%s", refusal)
	}
	for _, f := range fixes {
		if out, err := exec.Command("sh", "-c", f[1]).CombinedOutput(); err != nil {
			t.Fatalf("the fix %q: %v\n%s", f[1], err, out)
		}
	}
}

func chmod(t *testing.T, path string, m os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, m); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, path string, uid int) {
	t.Helper()
	if err := os.Lchown(path, uid, uid); err != nil {
		t.Fatal(err)
	}
}

// wantAll fails unless out contains every one of want.
func wantAll(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s does not say %q:\n%s", what, w, out)
		}
	}
}

// S3, P5 (issue 24, gap 2): the Edge refuses to start on a data_dir, or a
// file it keeps there, that anyone but its user (or root) can change, and
// says which path, what is wrong and the command that fixes it; that
// command, run as printed, lets it start. A symlinked data_dir or store is
// judged by its target. Loopback mode, which keeps only the reset key
// there, is held to the same.
func TestTheEdgeRefusesADataDirOthersCanChange(t *testing.T) {
	requireRoot(t)
	e := enrollSetup(t, false)
	data := e.reachable()
	e.start()
	e.add("n1")
	e.proc.stop()
	store, key := filepath.Join(data, registrar.StoreFile), filepath.Join(data, "quic-stateless-reset.key")
	elsewhere, shared := filepath.Join(e.dir, "elsewhere"), filepath.Join(e.dir, "shared")

	for _, c := range []struct {
		name   string
		tamper func()
		want   []string // in the refusal, beside "owner uid" and "mode"
	}{
		{"world-writable data_dir", func() { chmod(t, data, 0o777) }, []string{data, "mode 0777"}},
		{"group-writable data_dir", func() { chmod(t, data, 0o770) }, []string{data, "mode 0770"}},
		{"data_dir of another user", func() { chown(t, data, hostileUID) }, []string{data, "owner uid 65534"}},
		{"a store of another user", func() { chown(t, store, hostileUID) }, []string{store, "owner uid 65534"}},
		{"a reset key others can write", func() { chmod(t, key, 0o666) }, []string{key, "mode 0666"}},
		{"data_dir a link to a world-writable directory", func() {
			if err := os.Rename(data, elsewhere); err != nil {
				t.Fatal(err)
			}
			chmod(t, elsewhere, 0o777)
			if err := os.Symlink(elsewhere, data); err != nil {
				t.Fatal(err)
			}
		}, []string{elsewhere, "mode 0777"}},
		{"the store a link into a world-writable directory", func() {
			// The previous case's fix left data_dir a link to a safe
			// directory; this one moves the store out of it.
			if err := os.Mkdir(shared, 0o777); err != nil {
				t.Fatal(err)
			}
			chmod(t, shared, 0o777)
			target := filepath.Join(shared, registrar.StoreFile)
			if err := os.Rename(filepath.Join(elsewhere, registrar.StoreFile), target); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, filepath.Join(elsewhere, registrar.StoreFile)); err != nil {
				t.Fatal(err)
			}
		}, []string{shared, "mode 0777"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			c.tamper()
			out := e.refusedStart("on " + c.name)
			wantAll(t, "the refusal", out, append(c.want, "owner uid", "mode ", "fix: ")...)
			applyFixes(t, out)
			e.start()
			e.proc.stop()
		})
		if t.Failed() {
			return
		}
	}

	t.Run("loopback mode", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "loopback-data")
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		chmod(t, dir, 0o777)
		conf := filepath.Join(t.TempDir(), "edge.yaml")
		writeFile(t, conf, fmt.Sprintf("edge_id: edge-1\nlisten: {quic: \"127.0.0.1:%d\", http: \"127.0.0.1:%d\"}\nidentity: {mode: loopback}\ndata_dir: %s\n",
			freePort(t, "udp"), freePort(t, "tcp"), dir))
		lo := &enrollEdge{t: t, conf: conf}
		out := lo.refusedStart("in loopback mode on a world-writable data_dir")
		wantAll(t, "the refusal", out, dir, "mode 0777", "fix: ")
	})
}

// S3, P5 (issue 24, gap 2): the attacks a local user made on a
// world-writable data_dir, made again as uid 65534. Moving the store aside
// (every removal forgotten) and planting one with the attacker's own token
// for an enrolled Node's id (a CA-signed certificate for it) both need a
// start of the Edge on that directory, which it refuses; once the mode is
// fixed, a moved store is missing and a planted one belongs to the
// attacker, and it refuses again.
func TestAHostileUserCannotMoveOrPlantTheStore(t *testing.T) {
	requireRoot(t)
	e := enrollSetup(t, false)
	data := e.reachable()
	e.start()
	e.add("n1")
	if out, err := run(t, e.dir, bin.edged, "node", "remove", "n1", "--config", e.conf); err != nil {
		t.Fatalf("edged node remove n1: %v\n%s", err, out)
	}
	e.proc.stop()
	store := filepath.Join(data, registrar.StoreFile)

	// Moved aside.
	chmod(t, data, 0o777) // the operator's mistake
	if out, err := attack(t, "move-store", data); err != nil {
		t.Fatalf("the attacker could not move the store (the test's setup is wrong): %v\n%s", err, out)
	}
	out := e.refusedStart("on a world-writable data_dir whose store was moved aside")
	wantAll(t, "the refusal", out, data, "mode 0777")
	applyFixes(t, out)
	out = e.refusedStart("without its store")
	wantAll(t, "the refusal", out, store, "missing")
	if err := os.Rename(store+".moved", store); err != nil { // the operator puts it back
		t.Fatal(err)
	}
	e.start()
	e.proc.stop()
	if l := e.list(); len(l) != 1 || l[0].ID != "n1" || l[0].Removed.IsZero() {
		t.Fatalf("node list with the store back: %+v, want n1 removed", l)
	}

	// Planted.
	chmod(t, data, 0o777)
	if out, err := attack(t, "plant-store", data, "n1", filepath.Join(e.dir, "iop-ca.pem")); err != nil || !strings.Contains(out, "planted token iop1.") {
		t.Fatalf("the attacker could not plant a store (the test's setup is wrong): %v\n%s", err, out)
	}
	out = e.refusedStart("on a world-writable data_dir with a planted store")
	wantAll(t, "the refusal", out, data, "mode 0777")
	chmod(t, data, 0o700) // the operator fixes the mode only
	out = e.refusedStart("on a store planted by uid 65534")
	wantAll(t, "the refusal", out, store, "owner uid 65534")
}

// S3, P5 (issue 24, gap 2): the admin socket. A data_dir made
// world-writable after the Edge started lets uid 65534 put its own
// listener in place of admin.sock: `edged node remove` refuses it (it is
// not owned by the caller or root) rather than printing a removal that did
// not happen, and `edged node list` too. A caller of another uid that
// reaches the Edge's own socket is refused by the Edge and gets nothing.
func TestTheAdminSocketTrustsOnlyTheEdgesUser(t *testing.T) {
	requireRoot(t)
	e := enrollSetup(t, false)
	data := e.reachable()
	e.start()
	e.add("n1")

	chmod(t, data, 0o777)
	fake := startAttack(t, "swap-socket", regexp.MustCompile(`listening as uid 65534`), data)
	out, err := run(t, e.dir, bin.edged, "node", "remove", "n1", "--config", e.conf)
	if err == nil || strings.Contains(out, "Removed node") {
		t.Errorf("edged node remove trusted a socket of uid 65534: err=%v\n%s", err, out)
	}
	wantAll(t, "edged node remove", out, filepath.Join(data, registrar.SocketFile), "uid 65534")
	out, err = run(t, e.dir, bin.edged, "node", "list", "--config", e.conf)
	if err == nil || !strings.Contains(out, "uid 65534") {
		t.Errorf("edged node list trusted a socket of uid 65534: err=%v\n%s", err, out)
	}
	if s := fake.out.String(); strings.Contains(s, "served") {
		t.Errorf("the CLI sent its commands to the attacker's socket:\n%s", s)
	}
	fake.cmd.Process.Kill()
	<-fake.done
	chmod(t, data, 0o700)
	e.proc.stop()
	if l := e.list(); len(l) != 1 || l[0].ID != "n1" || !l[0].Removed.IsZero() {
		t.Errorf("node list: %+v, want n1 (not removed)", l)
	}

	// The Edge's own socket, opened to others by mistake (0666 in a
	// directory they can enter): it answers them with a refusal.
	e.start()
	chmod(t, data, 0o711)
	chmod(t, filepath.Join(data, registrar.SocketFile), 0o666)
	out, err = attack(t, "call-socket", data)
	if err == nil || strings.Contains(out, "got token") {
		t.Errorf("the Edge served a caller of uid 65534: err=%v\n%s", err, out)
	}
	wantAll(t, "the refused caller", out, "uid 65534")
	if out, err := run(t, e.dir, bin.edged, "node", "list", "--json", "--config", e.conf); err != nil || strings.Contains(out, "intruder") {
		t.Errorf("node list after the refused call: err=%v\n%s", err, out)
	}
	e.proc.stop()
}

// P5 (issue 24, gap 2): a data_dir that had a store and has lost it (a
// volume not mounted, a file deleted) is an error, not a fresh start that
// forgets every removal; the error says what is missing, and the command
// it gives starts over on purpose.
func TestTheEdgeRefusesToStartWithoutTheStoreItHad(t *testing.T) {
	e := enrollSetup(t, false)
	e.start()
	e.add("n1")
	if out, err := run(t, e.dir, bin.edged, "node", "remove", "n1", "--config", e.conf); err != nil {
		t.Fatalf("edged node remove n1: %v\n%s", err, out)
	}
	e.proc.stop()
	store := filepath.Join(e.dir, "data", registrar.StoreFile)
	if err := os.Remove(store); err != nil {
		t.Fatal(err)
	}
	out := e.refusedStart("without the store it had")
	wantAll(t, "the refusal", out, store, "missing", "removal", "start over: rm ")
	// `edged node list` opens the store itself when no Edge runs: it
	// must not make an empty one either.
	if listed, err := run(t, e.dir, bin.edged, "node", "list", "--config", e.conf); err == nil || !strings.Contains(listed, "missing") {
		t.Errorf("edged node list without the store: err=%v\n%s", err, listed)
	}
	applyFixes(t, out)
	e.start()
	if l := e.list(); len(l) != 0 {
		t.Errorf("node list after starting over: %+v, want none", l)
	}
	e.proc.stop()
}
