package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/iop-dev/iop/plugins/builtin"
	"github.com/iop-dev/iop/sdk"
	"github.com/iop-dev/iop/sdk/sdktest"
)

// builtinPrefix names an adapter compiled into noded on the verify command
// line: builtin:ollama.
const builtinPrefix = "builtin:"

// verifyFlags are the arguments of `noded adapter verify`.
type verifyFlags struct {
	path          string // adapter binary, or builtin:NAME
	config        string // JSON, or @file
	target        string
	slowTarget    string
	embedTarget   string
	unknownTarget string
	verbose       bool // the plugin's log lines to stderr
}

// verifyAdapter runs the adapter conformance kit (package sdktest) on the
// adapter f.path names and prints one line per check to w. It fails when a
// check failed, or when the arguments are wrong.
func verifyAdapter(w io.Writer, f verifyFlags) error {
	subject, err := verifySubject(f.path)
	if err != nil {
		return err
	}
	cfg, err := verifyConfig(f.config)
	if err != nil {
		return err
	}
	o := sdktest.Options{
		Config:        cfg,
		Target:        f.target,
		SlowTarget:    f.slowTarget,
		EmbedTarget:   f.embedTarget,
		UnknownTarget: f.unknownTarget,
	}
	if f.verbose {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	fmt.Fprintf(w, "verifying %s\n", f.path)
	results := sdktest.Verify(ctx, subject, o)
	failed := printResults(w, results)
	if failed > 0 {
		return fmt.Errorf("%s: %d of %d conformance checks failed", f.path, failed, len(results))
	}
	return nil
}

// verifySubject is the adapter at path: a binary, or builtin:NAME, which is
// this noded binary re-executed as `noded plugin NAME`, as the Node starts
// it.
func verifySubject(path string) (sdktest.Subject, error) {
	if name, ok := strings.CutPrefix(path, builtinPrefix); ok {
		if !builtin.Has(name) {
			return sdktest.Subject{}, fmt.Errorf("no built-in adapter %q (built in: %s)", name, strings.Join(builtin.Names(), ", "))
		}
		self, err := os.Executable()
		if err != nil {
			return sdktest.Subject{}, fmt.Errorf("finding the noded binary to re-execute: %w", err)
		}
		return sdktest.Subject{
			Binary:       self,
			Args:         []string{"plugin", name},
			DescribeArgs: []string{"plugin", name, "--describe"},
		}, nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return sdktest.Subject{}, fmt.Errorf("adapter binary: %w", err)
	}
	if st.IsDir() || st.Mode().Perm()&0o111 == 0 {
		return sdktest.Subject{}, fmt.Errorf("adapter binary %s is not an executable file", path)
	}
	// An absolute path: a bare file name must not be looked up in PATH.
	abs, err := filepath.Abs(path)
	if err != nil {
		return sdktest.Subject{}, fmt.Errorf("adapter binary: %w", err)
	}
	return sdktest.Subject{Binary: abs}, nil
}

// verifyConfig reads --config: inline JSON, or @file holding it. Empty
// means none (the adapter's defaults).
func verifyConfig(v string) (sdk.Config, error) {
	if v == "" {
		return nil, nil
	}
	b := []byte(v)
	if file, ok := strings.CutPrefix(v, "@"); ok {
		var err error
		if b, err = os.ReadFile(file); err != nil {
			return nil, fmt.Errorf("--config: %w", err)
		}
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("--config: not valid JSON: %.80q", b)
	}
	return sdk.Config(b), nil
}

// printResults prints one line per check (status, name, time, message;
// further lines of a message indented under it) and a summary, and
// returns the number of failed checks.
func printResults(w io.Writer, results []sdktest.Result) (failed int) {
	width := 0
	for _, r := range results {
		width = max(width, len(r.Name))
	}
	counts := map[sdktest.Status]int{}
	for _, r := range results {
		counts[r.Status]++
		lines := strings.Split(strings.TrimRight(r.Message, "\n"), "\n")
		fmt.Fprintf(w, "%-4s  %-*s  %7s  %s\n", r.Status, width, r.Name, r.Elapsed.Round(time.Millisecond), lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(w, "%*s%s\n", 4+2+width+2+7+2, "", l)
		}
	}
	fmt.Fprintf(w, "%d passed, %d failed, %d skipped\n", counts[sdktest.Pass], counts[sdktest.Fail], counts[sdktest.Skip])
	return counts[sdktest.Fail]
}
