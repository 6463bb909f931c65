package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ,
// which is 100 on every Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// proc is one IOP process the bench watches.
type proc struct {
	name string // "edged", "noded", "plugin ollama"
	pid  int
}

// iopProcs returns the IOP processes: the Edge, the Node, and the Node's
// plugin children.
func (s *stack) iopProcs() []proc {
	out := []proc{{"edged", s.edge.cmd.Process.Pid}, {"noded", s.node.cmd.Process.Pid}}
	for _, pid := range childPIDs(s.node.cmd.Process.Pid) {
		out = append(out, proc{"plugin " + pluginName(pid), pid})
	}
	return out
}

// cpuSample is the CPU time each watched process had used at one moment.
type cpuSample map[int]time.Duration

// sampleCPU reads utime+stime of every process: the time of all its
// threads, the exited ones included (a plugin's own children, if any, would
// not be counted; the shipped plugins start none).
func sampleCPU(procs []proc) cpuSample {
	out := make(cpuSample, len(procs))
	for _, p := range procs {
		f, err := statFields(p.pid)
		if err != nil || len(f) < 13 {
			continue
		}
		// After the ')' ending the command: state is field 0, utime 11, stime 12.
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		out[p.pid] = time.Duration(ut+st) * clockTick
	}
	return out
}

// cpuSince returns, per pid, the CPU used between before and now.
func cpuSince(before cpuSample, procs []proc) map[int]time.Duration {
	now := sampleCPU(procs)
	out := make(map[int]time.Duration, len(now))
	for pid, t := range now {
		out[pid] = t - before[pid] // a process started since counts from 0
	}
	return out
}

// peakRSS returns VmHWM, the peak resident set, of pid ("self" for the
// bench) in bytes.
func peakRSS(pid string) (int64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%s/status has no VmHWM", pid)
}

// resetPeak resets the peak resident set (VmHWM) of pid to its current
// resident set, by writing "5" to /proc/PID/clear_refs (Linux 4.0 and
// later), so that a later peakRSS is the peak of what ran in between.
func resetPeak(pid int) error {
	return os.WriteFile(filepath.Join("/proc", strconv.Itoa(pid), "clear_refs"), []byte("5"), 0)
}

// raiseFDLimit raises RLIMIT_NOFILE of this process (and so of the
// daemons it starts, which inherit it) to at least want, the hard limit
// too when it is below (as root, up to /proc/sys/fs/nr_open). It returns
// the soft limit it ends with.
func raiseFDLimit(want uint64) (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	if l.Cur >= want {
		return l.Cur, nil
	}
	if l.Max < want {
		hard := want
		if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
			if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
				hard = min(max(want, l.Max), n)
			}
		}
		raised := syscall.Rlimit{Cur: hard, Max: hard}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
			l = raised
		}
	}
	if l.Cur < l.Max {
		up := syscall.Rlimit{Cur: l.Max, Max: l.Max}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &up); err != nil {
			return l.Cur, err
		}
		l = up
	}
	if l.Cur < want {
		return l.Cur, fmt.Errorf("the hard limit is %d and could not be raised", l.Max)
	}
	return l.Cur, nil
}

// statFields returns the fields of /proc/PID/stat after the command name
// (which may hold spaces and parentheses; it ends at the last ')').
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	return strings.Fields(s[i+1:]), nil
}

// childPIDs returns the live pids whose parent is pid.
func childPIDs(pid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f, err := statFields(child); err == nil && len(f) > 1 && f[1] == strconv.Itoa(pid) && f[0] != "Z" {
			out = append(out, child)
		}
	}
	return out
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	f, err := statFields(pid)
	return err == nil && len(f) > 0 && f[0] != "Z"
}

// pluginName is the adapter a plugin process serves: the last word of its
// command line ("noded plugin ollama").
func pluginName(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return "?"
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	return args[len(args)-1]
}
