// Package datadir keeps the Edge's data_dir its own: before the Edge uses
// the directory, Check makes sure that no one but the Edge's user (or root)
// can change it or the files the Edge keeps there.
//
// Whoever can change data_dir holds the Node enrollment: they can put
// their own listener in place of admin.sock (so `edged node remove` talks
// to them), move enroll.db aside (the Edge starts with an empty store and
// every removal is forgotten), or put a store of their own there, holding a
// join token of theirs for the id of an enrolled Node (the Edge then signs
// them a certificate for it). So data_dir and each of those files must be
// owned by the Edge's effective user or root and writable by neither group
// nor others. A data_dir or file that is a symbolic link is judged by what
// it points to, and a file's target by its directory as well. The
// directories above data_dir are not checked: they are the operator's.
//
// Check is for Unix; elsewhere (Windows) file modes do not say who may
// write, and it checks only that data_dir is a directory.
package datadir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// The modes the Edge gives what it makes in data_dir.
const (
	DirMode  fs.FileMode = 0o700
	FileMode fs.FileMode = 0o600
)

// ErrUnsafe is matched by every *UnsafeError.
var ErrUnsafe = errors.New("unsafe data_dir")

// UnsafeError is a path in (or behind) data_dir that someone other than
// the Edge's user or root can change.
type UnsafeError struct {
	// What says what Path is when its name does not: "data_dir",
	// "enroll.db's target", "the directory of enroll.db's target".
	What string
	// Path is where the problem is, links resolved.
	Path string
	// UID and Mode are Path's owner and mode.
	UID  int
	Mode fs.FileMode
	// Foreign: owned by a user other than the Edge's and root.
	// Writable: writable by its group or by others.
	Foreign, Writable bool
	// Fix is the shell command that makes Path safe, for the Edge's user.
	Fix string
}

func (e *UnsafeError) Error() string {
	var why []string
	if e.Writable {
		who := "others"
		if e.Mode.Perm()&0o002 == 0 {
			who = "its group"
		}
		why = append(why, "writable by "+who)
	}
	if e.Foreign {
		edge := "root"
		if me := os.Geteuid(); me != 0 {
			edge = UserName(me) + " or root"
		}
		why = append(why, "not owned by the Edge's user ("+edge+")")
	}
	what := ""
	if e.What != "" {
		what = " (" + e.What + ")"
	}
	return fmt.Sprintf("%s: %s%s: owner uid %d (%s), mode %s: %s; whoever can change it can tamper with the Edge's Node enrollment\n  fix: %s",
		ErrUnsafe, e.Path, what, e.UID, UserName(e.UID), FormatMode(e.Mode), strings.Join(why, " and "), e.Fix)
}

// Is makes errors.Is(err, ErrUnsafe) true.
func (e *UnsafeError) Is(target error) bool { return target == ErrUnsafe }

// Prepare makes dir with DirMode if it does not exist, then checks it as
// Check does.
func Prepare(dir string, files ...string) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, DirMode); err != nil {
			return fmt.Errorf("data_dir: %w", err)
		}
	}
	return Check(dir, files...)
}

// Check returns nil when dir and each of files (names in dir) that exists
// can be changed by no one but the Edge's effective user and root;
// otherwise an error for each path that others can change, joined, each an
// *UnsafeError. A link is followed and its target checked; a file's target
// outside dir has its directory checked too.
func Check(dir string, files ...string) error {
	if dir == "" {
		return errors.New("data_dir: not set")
	}
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("data_dir: %w", err)
	}
	fi, err := os.Stat(resolved)
	if err != nil {
		return fmt.Errorf("data_dir: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("data_dir %s: not a directory", resolved)
	}
	what := "data_dir"
	if abs, err := filepath.Abs(dir); err == nil && filepath.Clean(abs) != resolved {
		what = "data_dir, linked from " + dir
	}
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	add(check(what, resolved, fi, fixDir(resolved)))
	for _, name := range files {
		add(checkFile(resolved, name))
	}
	return errors.Join(errs...)
}

// checkFile checks dir/name if it exists, and what it links to.
func checkFile(dir, name string) error {
	path := filepath.Join(dir, name)
	li, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("data_dir: %w", err)
	}
	if li.Mode().Type() != fs.ModeSymlink {
		return check("", path, li, fixFile(path))
	}
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		// A dangling link would have the Edge make the file wherever it
		// points.
		return fmt.Errorf("%w: %s is a link to nothing (%v): remove it, or restore what it pointed to", ErrUnsafe, path, err)
	}
	fi, err := os.Stat(target)
	if err != nil {
		return fmt.Errorf("data_dir: %w", err)
	}
	errs := []error{check(name+"'s target", target, fi, fixFile(target))}
	if parent := filepath.Dir(target); parent != dir {
		// Whoever can write the target's directory can replace the target.
		if pi, err := os.Stat(parent); err != nil {
			errs = append(errs, fmt.Errorf("data_dir: %w", err))
		} else {
			fix := "rm " + ShellQuote(path) + " && mv " + ShellQuote(target) + " " + ShellQuote(path)
			errs = append(errs, check("the directory of "+name+"'s target", parent, pi, fix))
		}
	}
	return errors.Join(errs...)
}

// check returns an *UnsafeError when fi (of path) is owned by another user
// than the Edge's and root, or writable by its group or others.
func check(what, path string, fi fs.FileInfo, fix string) error {
	uid, ok := Owner(fi)
	if !ok {
		return nil // no owner to check here: modes do not say who may write
	}
	e := &UnsafeError{What: what, Path: path, UID: uid, Mode: fi.Mode(), Foreign: !Trusted(uid), Writable: fi.Mode().Perm()&0o022 != 0, Fix: fix}
	if !e.Foreign && !e.Writable {
		return nil
	}
	return e
}

// Trusted reports whether uid may own what the Edge keeps: the Edge's
// effective user, or root.
func Trusted(uid int) bool { return uid == os.Geteuid() || uid == 0 }

func fixDir(path string) string {
	p := ShellQuote(path)
	return fmt.Sprintf("chown %s %s && chmod %o %s", ShellQuote(UserName(os.Geteuid())), p, DirMode, p)
}

func fixFile(path string) string {
	p := ShellQuote(path)
	return fmt.Sprintf("chown %s %s && chmod %o %s", ShellQuote(UserName(os.Geteuid())), p, FileMode, p)
}

// UserName is uid's login name, or the number when it has none.
func UserName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil && u.Username != "" {
		return u.Username
	}
	return strconv.Itoa(uid)
}

// FormatMode writes m's permission bits as chmod takes them: 0700, 1777.
func FormatMode(m fs.FileMode) string {
	p := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		p |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		p |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		p |= 0o1000
	}
	return fmt.Sprintf("%04o", p)
}

var plainWord = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// ShellQuote quotes s for a POSIX shell when it needs it.
func ShellQuote(s string) string {
	if plainWord.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
