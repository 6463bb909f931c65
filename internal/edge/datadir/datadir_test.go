//go:build unix

package datadir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// nobody is a uid other than the test's and root's.
const nobody = 65534

func mkdir(t *testing.T, path string, m fs.FileMode) {
	t.Helper()
	if err := os.Mkdir(path, m); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, m); err != nil { // past the umask
		t.Fatal(err)
	}
}

func write(t *testing.T, path string, m fs.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte("x"), m); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, m); err != nil {
		t.Fatal(err)
	}
}

func do(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// fixes returns the commands err gives as its fixes.
func fixes(err error) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^  fix: (.+)$`).FindAllStringSubmatch(err.Error(), -1) {
		out = append(out, m[1])
	}
	return out
}

func TestPrepareMakesAMissingDataDirForTheEdgeAlone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "data")
	if err := Prepare(dir, "enroll.db"); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != DirMode {
		t.Fatalf("made %v %v, want a directory of mode %v", fi.Mode(), err, DirMode)
	}
}

// Only writing matters: a data_dir others may read and enter, and files
// they may read, are the operator's choice.
func TestReadableIsNotUnsafe(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	mkdir(t, dir, 0o755)
	write(t, filepath.Join(dir, "enroll.db"), 0o644)
	if err := Check(dir, "enroll.db", "absent.key"); err != nil {
		t.Fatalf("0755 data_dir, 0644 file, a missing file: %v", err)
	}
}

// Issue 24, gap 2: each way someone other than the Edge's user could
// change data_dir or a file in it is refused with the path, its owner and
// mode, and the command that fixes it; that command, run, makes it safe.
func TestDataDirsOthersCanChangeAreRefusedWithTheFix(t *testing.T) {
	root := os.Geteuid() == 0
	for _, c := range []struct {
		name     string
		needRoot bool
		// setup makes data_dir (dir) in base and returns the path the
		// refusal must name and what it must say of it.
		setup func(t *testing.T, base, dir string) (path, says string)
	}{
		{"world-writable data_dir", false, func(t *testing.T, _, dir string) (string, string) {
			mkdir(t, dir, 0o777)
			return dir, "mode 0777: writable by others"
		}},
		{"sticky world-writable data_dir", false, func(t *testing.T, _, dir string) (string, string) {
			mkdir(t, dir, 0o777|fs.ModeSticky) // others could still make enroll.db in it
			return dir, "mode 1777"
		}},
		{"group-writable data_dir", false, func(t *testing.T, _, dir string) (string, string) {
			mkdir(t, dir, 0o770)
			return dir, "mode 0770: writable by its group"
		}},
		{"data_dir of another user", true, func(t *testing.T, _, dir string) (string, string) {
			mkdir(t, dir, 0o700)
			do(t, os.Chown(dir, nobody, nobody))
			return dir, fmt.Sprintf("owner uid %d", nobody)
		}},
		{"a file others can write", false, func(t *testing.T, _, dir string) (string, string) {
			mkdir(t, dir, 0o700)
			write(t, filepath.Join(dir, "enroll.db"), 0o666)
			return filepath.Join(dir, "enroll.db"), "mode 0666"
		}},
		{"a file of another user", true, func(t *testing.T, _, dir string) (string, string) {
			mkdir(t, dir, 0o700)
			write(t, filepath.Join(dir, "reset.key"), 0o600)
			do(t, os.Chown(filepath.Join(dir, "reset.key"), nobody, nobody))
			return filepath.Join(dir, "reset.key"), fmt.Sprintf("owner uid %d", nobody)
		}},
		{"data_dir a link to a world-writable directory", false, func(t *testing.T, base, dir string) (string, string) {
			target := filepath.Join(base, "target")
			mkdir(t, target, 0o777)
			do(t, os.Symlink(target, dir))
			return target, "linked from " + dir
		}},
		{"a file linked to one others can write", false, func(t *testing.T, base, dir string) (string, string) {
			mkdir(t, dir, 0o700)
			target := filepath.Join(base, "enroll.db")
			write(t, target, 0o622)
			do(t, os.Symlink(target, filepath.Join(dir, "enroll.db")))
			return target, "enroll.db's target"
		}},
		{"a file linked into a directory others can write", false, func(t *testing.T, base, dir string) (string, string) {
			mkdir(t, dir, 0o700)
			shared := filepath.Join(base, "shared dir") // a space: the fix quotes it
			mkdir(t, shared, 0o777)
			write(t, filepath.Join(shared, "enroll.db"), 0o600)
			do(t, os.Symlink(filepath.Join(shared, "enroll.db"), filepath.Join(dir, "enroll.db")))
			return shared, "the directory of enroll.db's target"
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.needRoot && !root {
				t.Skip("needs root: only root can give a path to another user")
			}
			base := t.TempDir()
			dir := filepath.Join(base, "data")
			path, says := c.setup(t, base, dir)
			err := Check(dir, "enroll.db", "reset.key")
			var u *UnsafeError
			if !errors.Is(err, ErrUnsafe) || !errors.As(err, &u) {
				t.Fatalf("Check: %v, want an *UnsafeError", err)
			}
			for _, want := range []string{path + " ", says, "owner uid ", "mode ", "\n  fix: "} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q:\n%v", want, err)
				}
			}
			fix := fixes(err)
			if len(fix) != 1 {
				t.Fatalf("fixes %q, want one:\n%v", fix, err)
			}
			if out, err := exec.Command("sh", "-c", fix[0]).CombinedOutput(); err != nil {
				t.Fatalf("the fix %q: %v\n%s", fix[0], err, out)
			}
			if err := Check(dir, "enroll.db", "reset.key"); err != nil {
				t.Errorf("after the fix %q: %v", fix[0], err)
			}
		})
	}
}

// Every problem is said at once, not one per start.
func TestEveryUnsafePathIsNamed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	mkdir(t, dir, 0o777)
	write(t, filepath.Join(dir, "a"), 0o666)
	write(t, filepath.Join(dir, "b"), 0o600)
	write(t, filepath.Join(dir, "c"), 0o660)
	err := Check(dir, "a", "b", "c")
	if n := len(fixes(err)); n != 3 {
		t.Fatalf("%d fixes, want 3 (data_dir, a, c):\n%v", n, err)
	}
	for _, name := range []string{"a", "c"} {
		if !strings.Contains(err.Error(), filepath.Join(dir, name)+": owner") {
			t.Errorf("%s not named:\n%v", name, err)
		}
	}
}

func TestADanglingLinkIsRefused(t *testing.T) {
	dir := t.TempDir()
	do(t, os.Symlink(filepath.Join(dir, "nowhere", "enroll.db"), filepath.Join(dir, "enroll.db")))
	if err := Check(dir, "enroll.db"); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "a link to nothing") {
		t.Errorf("Check: %v", err)
	}
}

func TestNotADirectory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "data")
	write(t, file, 0o600)
	if err := Check(file); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("Check of a file: %v", err)
	}
	if err := Check(""); err == nil {
		t.Error("Check of no data_dir: nil")
	}
}

func TestFormatModeAndShellQuote(t *testing.T) {
	for m, want := range map[fs.FileMode]string{0o700: "0700", 0o777 | fs.ModeSticky: "1777", 0o755 | fs.ModeSetgid: "2755", fs.ModeDir | 0o750: "0750"} {
		if got := FormatMode(m); got != want {
			t.Errorf("FormatMode(%v) = %s, want %s", m, got, want)
		}
	}
	for s, want := range map[string]string{"/var/lib/iop": "/var/lib/iop", "/a b": "'/a b'", "it's": `'it'\''s'`, "": "''"} {
		if got := ShellQuote(s); got != want {
			t.Errorf("ShellQuote(%q) = %s, want %s", s, got, want)
		}
	}
}
