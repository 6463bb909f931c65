package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// profileWindow is the longest perf records during workload 2's iop half.
const profileWindow = 10 * time.Second

// profileTop is how many entries of perf's report go to its text file.
const profileTop = 25

// profileFigure is one perf profile of one IOP process during workload 2's
// iop half through one API.
type profileFigure struct {
	API     string        `json:"api"`
	Process string        `json:"process"`
	Data    string        `json:"perf_data"`
	Report  string        `json:"report"`
	Window  time.Duration `json:"window_ns"`
	// Top are the report's first entries: share of samples and symbol.
	Top   []string `json:"top,omitempty"`
	Error string   `json:"error,omitempty"`
}

// perfRun is perf recording each IOP process, one perf process each.
type perfRun struct {
	perf  string
	start time.Time
	recs  []*perfRecord
}

type perfRecord struct {
	fig   profileFigure
	cmd   *exec.Cmd
	out   bytes.Buffer
	done  chan struct{}
	timer *time.Timer // ends the recording after the window
}

// startPerf starts `perf record -g -p PID` on each of procs, writing
// dir/<api>-<process>.perf.data, for at most window; nil, with a note in
// res, when perf is missing or will not start.
func startPerf(ctx context.Context, dir, api string, procs []proc, window time.Duration, res *results) *perfRun {
	perf, err := exec.LookPath("perf")
	if err != nil {
		res.note("-profile: perf is not installed (%v): no profiles taken", err)
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		res.note("-profile: %v", err)
		return nil
	}
	p := &perfRun{perf: perf, start: time.Now()}
	for _, pr := range procs {
		base := filepath.Join(dir, api+"-"+strings.ReplaceAll(pr.name, " ", "-"))
		r := &perfRecord{done: make(chan struct{}), fig: profileFigure{API: api, Process: pr.name,
			Data: base + ".perf.data", Report: base + ".txt"}}
		// cpu-clock: a software event, since the hardware counters are not
		// always there (in a VM, a container).
		r.cmd = exec.Command(perf, "record", "-g", "-e", "cpu-clock", "-F", "1999",
			"-p", strconv.Itoa(pr.pid), "-o", r.fig.Data)
		r.cmd.Stdout, r.cmd.Stderr = &r.out, &r.out
		r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := r.cmd.Start(); err != nil {
			res.note("-profile: perf record of %s: %v", pr.name, err)
			continue
		}
		go func() {
			_ = r.cmd.Wait()
			close(r.done)
		}()
		r.timer = time.AfterFunc(window, func() { _ = r.cmd.Process.Signal(os.Interrupt) })
		p.recs = append(p.recs, r)
	}
	if len(p.recs) == 0 {
		return nil
	}
	return p
}

// stop ends the recordings (SIGINT, as at a terminal) and writes each
// report: `perf report --no-children --sort sym`, its first profileTop
// entries.
func (p *perfRun) stop(ctx context.Context) []profileFigure {
	window := time.Since(p.start)
	var out []profileFigure
	for _, r := range p.recs {
		if r.timer.Stop() {
			_ = r.cmd.Process.Signal(os.Interrupt)
		}
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			_ = r.cmd.Process.Kill()
			<-r.done
		}
		r.fig.Window = min(window, profileWindow)
		if st := r.cmd.ProcessState; st == nil || !recorded(st) {
			r.fig.Error = fmt.Sprintf("perf record: %v: %s", r.cmd.ProcessState, lastLine(r.out.String()))
			out = append(out, r.fig)
			continue
		}
		r.fig.Top, r.fig.Error = p.report(ctx, r.fig)
		out = append(out, r.fig)
	}
	return out
}

// recorded reports whether perf record ended as asked: cleanly, or by the
// SIGINT that stops it.
func recorded(st *os.ProcessState) bool {
	if st.Success() {
		return true
	}
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && (ws.Signaled() && ws.Signal() == syscall.SIGINT || ws.ExitStatus() == 130)
}

// report runs perf report on f's data and writes its first entries to
// f.Report; it returns the first ten.
func (p *perfRun) report(ctx context.Context, f profileFigure) ([]string, string) {
	cmd := exec.CommandContext(ctx, p.perf, "report", "-i", f.Data, "--no-children", "--sort", "sym",
		"--stdio", "-g", "none")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Sprintf("perf report: %v: %s", err, lastLine(stderr.String()))
	}
	var head, top []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() && len(top) < profileTop {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "# Samples") || strings.HasPrefix(line, "# Event count"):
			head = append(head, line)
		case strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#"):
		default:
			top = append(top, strings.TrimSpace(line))
		}
	}
	if len(top) == 0 {
		head = append(head, "# no samples: the process used no CPU in the window")
	}
	text := fmt.Sprintf("# perf report --no-children --sort sym: %s during workload 2's iop half (%s), %v\n%s\n%s\n",
		f.Process, f.API, f.Window.Round(time.Millisecond), strings.Join(head, "\n"), strings.Join(top, "\n"))
	if err := os.WriteFile(f.Report, []byte(text), 0o644); err != nil {
		return nil, err.Error()
	}
	return top[:min(len(top), 10)], ""
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
