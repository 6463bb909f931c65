package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
	"github.com/iop-dev/iop/sdk"
	"github.com/iop-dev/iop/sdk/sdktest"
)

// buildBinaries builds noded and the SDK's test adapter into a temporary
// directory and returns their paths.
func buildBinaries(t *testing.T) (noded, testadapter string) {
	t.Helper()
	dir := t.TempDir()
	noded, testadapter = filepath.Join(dir, "noded"), filepath.Join(dir, "testadapter")
	for bin, pkg := range map[string]string{
		noded:       "github.com/iop-dev/iop/noded",
		testadapter: "github.com/iop-dev/iop/internal/testadapter/cmd/testadapter",
	} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return noded, testadapter
}

// verifyCmd runs `noded adapter verify args...` and returns its output and
// exit code.
func verifyCmd(t *testing.T, noded string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(noded, append([]string{"adapter", "verify"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit):
		return out.String(), exit.ExitCode()
	}
	t.Fatalf("noded adapter verify: %v\n%s", err, out.String())
	return "", 0
}

// checkLines returns the status word of each check line of verify's output.
func checkLines(out string) map[string]string {
	lines := map[string]string{}
	for _, c := range sdktest.Checks() {
		for l := range strings.SplitSeq(out, "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[1] == c.Name {
				lines[c.Name] = f[0]
			}
		}
	}
	return lines
}

// `noded adapter verify` runs every conformance check on a third-party
// binary or a built-in adapter, prints one line per check and exits 0 only
// when none failed.
func TestAdapterVerifyCommand(t *testing.T) {
	noded, testadapter := buildBinaries(t)
	fake := fakeollama.New(
		fakeollama.Model{Name: "llama3.2:latest"},
		fakeollama.Model{Name: "slow:latest", TokenCount: 1000, TokenDelay: 20 * time.Millisecond},
	)
	t.Cleanup(fake.Close)
	ollamaConfig := filepath.Join(t.TempDir(), "ollama.json")
	if err := os.WriteFile(ollamaConfig, sdk.MustConfig(map[string]string{"base_url": fake.URL()}), 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		args     []string
		wantExit int
		want     map[string]string // check → status; unnamed checks must not FAIL
	}{
		{
			name: "a third-party binary passes",
			args: []string{testadapter, "--target", "text:5", "--slow-target", "text:1000000", "--unknown-target", "nope"},
			want: map[string]string{"describe": "PASS", "cancel": "PASS", "error_mapping": "PASS", "complete": "PASS", "embed": "PASS", "no_stdout": "PASS"},
		},
		{
			name: "builtin:simulator passes, its target defaulting to the one it lists",
			args: []string{"builtin:simulator", "--slow-target", "sim-small", "--unknown-target", "nope"},
			want: map[string]string{"describe": "PASS", "ordering": "PASS", "cancel": "PASS", "restart": "PASS", "no_stdout": "PASS"},
		},
		{
			name: "builtin:ollama passes with its configuration from a file",
			args: []string{"builtin:ollama", "--config", "@" + ollamaConfig, "--target", "llama3.2", "--slow-target", "slow", "--unknown-target", "nope"},
			want: map[string]string{"honest_capabilities": "PASS", "cancel": "PASS", "error_mapping": "PASS", "embed": "PASS", "no_stdout": "PASS"},
		},
		{
			name:     "a failed check exits 1",
			args:     []string{testadapter, "--target", "text:5", "--unknown-target", "text:1"},
			wantExit: 1,
			want:     map[string]string{"error_mapping": "FAIL", "cancel": "SKIP"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, code := verifyCmd(t, noded, tt.args...)
			t.Logf("noded adapter verify %s\n%s", strings.Join(tt.args, " "), out)
			if code != tt.wantExit {
				t.Errorf("exit code %d; want %d", code, tt.wantExit)
			}
			got := checkLines(out)
			if len(got) != len(sdktest.Checks()) {
				t.Errorf("printed %d check lines; want one per check (%d)", len(got), len(sdktest.Checks()))
			}
			for name, status := range got {
				want, named := tt.want[name]
				switch {
				case named && status != want:
					t.Errorf("check %s: %s; want %s", name, status, want)
				case !named && status == "FAIL":
					t.Errorf("check %s failed", name)
				}
			}
		})
	}

	out, code := verifyCmd(t, noded, "builtin:nope")
	if code != 1 || !strings.Contains(out, `no built-in adapter "nope" (built in: ollama, openai, simulator)`) {
		t.Errorf("verify builtin:nope: exit %d, %q", code, out)
	}
}

// The built-in adapters pass the conformance kit as plugin processes, the
// way the Node runs them: the noded binary re-executed as `noded plugin
// NAME`. (Their own packages run the kit on them in process.)
func TestBuiltinAdaptersConformAsPluginProcesses(t *testing.T) {
	noded, _ := buildBinaries(t)
	builtin := func(name string) sdktest.Subject {
		return sdktest.Subject{Binary: noded, Args: []string{"plugin", name}, DescribeArgs: []string{"plugin", name, "--describe"}}
	}

	t.Run("ollama", func(t *testing.T) {
		fake := fakeollama.New(
			fakeollama.Model{Name: "llama3.2:latest"},
			fakeollama.Model{Name: "slow:latest", TokenCount: 1000, TokenDelay: 20 * time.Millisecond},
			fakeollama.Model{Name: "busy:latest", FailStatus: 429, FailMessage: "server busy"},
			fakeollama.Model{Name: "overloaded:latest", FailStatus: 503, FailMessage: "server overloaded"},
		)
		t.Cleanup(fake.Close)
		sdktest.Run(t, builtin("ollama"), sdktest.Options{
			Config:        sdk.MustConfig(map[string]string{"base_url": fake.URL()}),
			Target:        "llama3.2",
			SlowTarget:    "slow",
			UnknownTarget: "nope",
			TunnelPath:    "/api/version",
			ErrorCases: []sdktest.ErrorCase{
				{Name: "429", Target: "busy", Want: sdk.KindRateLimited},
				{Name: "503", Target: "overloaded", Want: sdk.KindUnavailable},
			},
		})
	})

	t.Run("openai", func(t *testing.T) {
		srv := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{
			{Name: "gpt-test"},
			{Name: "slow", TokenCount: 1000, Delay: 20 * time.Millisecond},
			{Name: "busy", Fail: &fakeopenai.Failure{Status: 429, Message: "Rate limit reached"}},
		}})
		t.Cleanup(srv.Close)
		requireKey := func() func() {
			srv.Update(func(c *fakeopenai.Config) { c.APIKey = "sk-conformance" })
			return func() { srv.Update(func(c *fakeopenai.Config) { c.APIKey = "" }) }
		}
		sdktest.Run(t, builtin("openai"), sdktest.Options{
			Config:        sdk.MustConfig(map[string]string{"base_url": srv.BaseURL()}),
			Target:        "gpt-test",
			SlowTarget:    "slow",
			UnknownTarget: "nope",
			TunnelPath:    "/models",
			ErrorCases: []sdktest.ErrorCase{
				{Name: "429", Target: "busy", Want: sdk.KindRateLimited},
				{Name: "401", Setup: requireKey, Want: sdk.KindUnauthenticated},
			},
		})
	})

	t.Run("simulator", func(t *testing.T) {
		sdktest.Run(t, builtin("simulator"), sdktest.Options{
			Config: sdk.Config(`{"models":[
				{"name":"sim","tokens":8,"token_interval":"1ms"},
				{"name":"slow","tokens":1000,"token_interval":"20ms"},
				{"name":"down","fail":{"kind":"unavailable"}}
			]}`),
			Target:        "sim",
			SlowTarget:    "slow",
			UnknownTarget: "nope",
			ErrorCases:    []sdktest.ErrorCase{{Name: "unavailable", Target: "down", Want: sdk.KindUnavailable}},
		})
	})
}
