package pluginhost_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// `adapter describe` prints the adapter's info as JSON to stdout and exits
// without serving.
func TestDescribeCommandPrintsInfoAsJSON(t *testing.T) {
	type description struct {
		Name            string            `json:"name"`
		Version         string            `json:"version"`
		Description     string            `json:"description"`
		ConfigFields    map[string]string `json:"config_fields"`
		Capabilities    []string          `json:"capabilities"`
		ProtocolVersion int               `json:"protocol_version"`
	}
	cases := []struct {
		variant string
		name    string
		caps    []string
	}{
		{"", "testadapter", []string{"list_targets", "tunnel", "probe", "close", "complete", "embed"}},
		{"minimal", "testadapter-minimal", []string{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(adapterBin, "describe")
			cmd.Env = append(os.Environ(), "IOP_TESTADAPTER_VARIANT="+c.variant)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("describe: %v\n%s", err, stderr.String())
			}
			dec := json.NewDecoder(&stdout)
			dec.DisallowUnknownFields()
			var d description
			if err := dec.Decode(&d); err != nil {
				t.Fatalf("describe output is not the JSON object: %v", err)
			}
			if dec.More() || stderr.Len() != 0 {
				t.Errorf("describe wrote more than one object, or to stderr: %q", stderr.String())
			}
			if d.Name != c.name || d.Version != "0.0.1" || d.Description == "" || d.ConfigFields["prefix"] == "" ||
				d.ProtocolVersion != pluginpb.ProtocolVersion || strings.Join(d.Capabilities, ",") != strings.Join(c.caps, ",") || d.Capabilities == nil {
				t.Errorf("describe = %+v", d)
			}
		})
	}
}

// An adapter binary run by hand says it is a plugin and exits 1, writing
// nothing to stdout.
func TestAdapterRunByHandRefusesToServe(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(adapterBin)
	cmd.Env = []string{}
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || stdout.Len() != 0 || !strings.Contains(stderr.String(), "plugin") {
		t.Fatalf("run by hand: %v, stdout %q, stderr %q", err, stdout.String(), stderr.String())
	}
}

// A plugin process that dies mid-run ends the run with an error that is
// both ErrPluginExited and sdk.ErrUnavailable (provider_unavailable at the
// Edge); later calls fail the same way at once.
func TestPluginExitMidRunIsUnavailable(t *testing.T) {
	p, rec := startProcess(t, false)
	_, _, err := collect(t.Context(), p, run("exit"))
	if !errors.Is(err, pluginhost.ErrPluginExited) || !errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("run on a dying plugin: %v", err)
	}
	if f := pluginhost.FailureToWire(err); f.GetKind() != wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE {
		t.Errorf("FailureToWire = %v", f)
	}
	select {
	case <-p.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("Exited not closed after the process exited")
	}
	if _, err := p.ListTargets(t.Context()); !errors.Is(err, pluginhost.ErrPluginExited) || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("call after the exit: %v", err)
	}
	if err := p.Close(t.Context()); err != nil {
		t.Errorf("Close after the exit: %v", err)
	}
	found := false
	for _, r := range rec.all() {
		if r.msg == "plugin process exited" && strings.Contains(r.attrs["status"].(string), "exit status 3") && r.attrs["plugin"] == "test" && r.level == slog.LevelInfo {
			found = true
		}
	}
	if !found {
		t.Errorf("no exit log record at info level with the status in %v", rec.all())
	}
}

// A Node stops idle plugins and starts them again as calls need them
// (execution's idle stop): the exit of a process the host closed is
// expected, and logged at debug level, not as news.
func TestExitTheHostAskedForIsLoggedAtDebug(t *testing.T) {
	p, rec := startProcess(t, false)
	if err := p.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	var levels []slog.Level
	for _, r := range rec.all() {
		if r.msg == "plugin process exited" || r.msg == "plugin started" {
			levels = append(levels, r.level)
		}
	}
	if !slices.Equal(levels, []slog.Level{slog.LevelDebug, slog.LevelDebug}) {
		t.Errorf("start and exit logged at %v, want debug both", levels)
	}
}

// Decision 7: whatever a plugin writes to stderr or stdout lands in the
// host's log, parsed leniently, and never hurts the host.
func TestGarbageOutputDoesNotHurtTheHost(t *testing.T) {
	p, rec := startProcess(t, false)
	if _, _, err := collect(t.Context(), p, run("garbage")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := collect(t.Context(), p, run("text:2")); err != nil {
		t.Fatalf("run after the garbage: %v", err)
	}
	if err := p.Close(t.Context()); err != nil { // flushes the log
		t.Fatal(err)
	}
	var hello, plain, weird, truncated, stdoutLines int
	for _, r := range rec.all() {
		if r.attrs["plugin"] != "test" {
			t.Errorf("record without plugin=test: %+v", r)
		}
		switch {
		case r.msg == "hello from plugin":
			hello++
			if r.level != slog.LevelWarn || r.attrs["k"] == nil {
				t.Errorf("hclog line parsed as %+v", r)
			}
		case r.msg == "not json at all":
			plain++
			if r.level != slog.LevelInfo {
				t.Errorf("plain line at %v", r.level)
			}
		case r.msg == "[x]":
			weird++
		case r.attrs["truncated"] == true:
			truncated++
			if len(r.msg) > 8<<10 {
				t.Errorf("truncated line of %d bytes", len(r.msg))
			}
		case r.attrs["stream"] == "stdout":
			stdoutLines++
		}
	}
	if hello != 1 || plain != 1 || weird != 1 || truncated != 1 || stdoutLines != 2 {
		t.Errorf("hello %d, plain %d, weird-typed %d, truncated %d, stdout %d; records:\n%v",
			hello, plain, weird, truncated, stdoutLines, rec.all())
	}
}

// A pinned checksum that does not match refuses the binary before it
// runs, naming the file and both hashes; a matching one starts it.
func TestSHA256PinIsCheckedBeforeStart(t *testing.T) {
	bin, err := os.ReadFile(adapterBin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(bin)
	wrong := sha256.Sum256([]byte("another binary"))

	cmd := exec.Command(adapterBin)
	_, err = pluginhost.Start(t.Context(), pluginhost.Options{Cmd: cmd, SHA256: wrong[:]})
	if !errors.Is(err, pluginhost.ErrChecksumMismatch) || cmd.Process != nil {
		t.Fatalf("Start with a wrong pin: %v (process %v)", err, cmd.Process)
	}
	for _, s := range []string{adapterBin, hex.EncodeToString(sum[:]), hex.EncodeToString(wrong[:])} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %s", err, s)
		}
	}

	p, err := pluginhost.Start(t.Context(), pluginhost.Options{Cmd: exec.Command(adapterBin), SHA256: sum[:]})
	if err != nil {
		t.Fatalf("Start with the right pin: %v", err)
	}
	if err := p.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A program that is not a plugin, or one that never answers the
// handshake, fails Start (at once when ctx ends) and leaves no process.
func TestStartFailsForAProgramThatIsNotAPlugin(t *testing.T) {
	cases := []struct {
		name    string
		cmd     *exec.Cmd
		timeout time.Duration // of ctx; Options.StartTimeout is 30s
		want    string
	}{
		{"exits", exec.Command("true"), 10 * time.Second, "Failed to read any lines from plugin's stdout"},
		{"silent, ctx ends", exec.Command("sleep", "60"), 300 * time.Millisecond, "context deadline exceeded"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), c.timeout)
			defer cancel()
			began := time.Now()
			_, err := pluginhost.Start(ctx, pluginhost.Options{Cmd: c.cmd, StartTimeout: 30 * time.Second})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Start = %v, want %q", err, c.want)
			}
			if took := time.Since(began); took > 5*time.Second {
				t.Errorf("Start took %v", took)
			}
			if c.cmd.ProcessState == nil {
				t.Error("the process was not waited for")
			}
		})
	}
}
