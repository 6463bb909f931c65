package sdktest_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/testadapter"
	"github.com/iop-dev/iop/sdk"
	"github.com/iop-dev/iop/sdk/sdktest"
	"go.uber.org/goleak"
)

// adapterBin is the test adapter binary TestMain builds.
var adapterBin string

// brokenEnv makes the test binary serve the broken adapter it names (see
// brokenBinaries) as a plugin, instead of running tests.
const brokenEnv = "IOP_SDKTEST_BROKEN"

func TestMain(m *testing.M) {
	if name := os.Getenv(brokenEnv); name != "" {
		newAdapter, ok := brokenBinaries[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "no broken adapter %q\n", name)
			os.Exit(2)
		}
		sdk.Serve(newAdapter())
	}
	dir, err := os.MkdirTemp("", "sdktest-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	adapterBin = filepath.Join(dir, "testadapter")
	build := exec.Command("go", "build", "-o", adapterBin, "github.com/iop-dev/iop/internal/testadapter/cmd/testadapter")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the test adapter: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		// The kit closes every plugin it started and waits for its runs.
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines leaked: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testadapterOptions drive the test adapter's scripts (see package
// testadapter).
func testadapterOptions() sdktest.Options {
	return sdktest.Options{
		Config:        sdk.Config(`{"prefix":""}`),
		Target:        "text:5",
		SlowTarget:    "text:1000000", // far more events than a stream buffers: cancelled long before the end
		UnknownTarget: "no-such-script",
		ErrorCases: []sdktest.ErrorCase{
			{Name: "rate limited", Target: "fail:rate_limited", Want: sdk.KindRateLimited},
			{Name: "unauthenticated", Target: "fail:unauthenticated", Want: sdk.KindUnauthenticated},
			{Name: "unavailable", Target: "fail:unavailable", Want: sdk.KindUnavailable},
		},
	}
}

func TestTestAdapterConformsInProcess(t *testing.T) {
	sdktest.Run(t, sdktest.Subject{Adapter: func() sdk.Adapter { return testadapter.New() }}, testadapterOptions())
}

func TestTestAdapterConformsAsABinary(t *testing.T) {
	sdktest.Run(t, sdktest.Subject{Binary: adapterBin}, testadapterOptions())
}

// An adapter without optional capabilities conforms too: every capability
// it lacks answers unsupported.
func TestAdapterWithoutCapabilitiesConforms(t *testing.T) {
	sdktest.Run(t, sdktest.Subject{Adapter: func() sdk.Adapter { return testadapter.NewMinimal() }}, testadapterOptions())
	sdktest.Run(t, sdktest.Subject{Binary: adapterBin, Env: []string{"IOP_TESTADAPTER_VARIANT=minimal"}}, testadapterOptions())
}

// Without Options.Target, the kit runs the first target the adapter lists.
func TestTargetDefaultsToTheFirstListed(t *testing.T) {
	o := testadapterOptions()
	o.Target = ""
	results := sdktest.Verify(t.Context(), sdktest.Subject{Adapter: func() sdk.Adapter { return testadapter.New() }}, o)
	ordering := result(t, results, "ordering")
	if ordering.Status != sdktest.Pass || !strings.Contains(ordering.Message, `"text:3"`) {
		t.Fatalf("ordering: %+v; want a pass on the first listed target, text:3", ordering)
	}
}

// Each deliberately broken adapter fails the one check that looks at what
// it gets wrong, with a message that names the problem, and passes the
// others.
func TestBrokenAdaptersFailTheirCheck(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	inProcess := func(f func(*testadapter.Adapter) sdk.Adapter) sdktest.Subject {
		return sdktest.Subject{Adapter: func() sdk.Adapter { return f(testadapter.New()) }}
	}
	tests := []struct {
		name    string
		subject sdktest.Subject
		tweak   func(*sdktest.Options)
		check   string
		want    []string
	}{
		{
			name:    "a capability it reports but does not implement",
			subject: inProcess(func(a *testadapter.Adapter) sdk.Adapter { return liar{a} }),
			check:   "honest_capabilities",
			want:    []string{"reports probe", "unsupported", "probing is not implemented yet"},
		},
		{
			name:    "a run that ignores its cancellation",
			subject: inProcess(func(a *testadapter.Adapter) sdk.Adapter { return ignoresCancel{a, release} }),
			tweak:   func(o *sdktest.Options) { o.SlowTarget = "slow" },
			check:   "cancel",
			want:    []string{"still running", "must stop its upstream request", "ignoresCancel"},
		},
		{
			name:    "a configuration with unknown keys accepted",
			subject: inProcess(func(a *testadapter.Adapter) sdk.Adapter { return looseConfig{a} }),
			check:   "strict_config",
			want:    []string{"accepted", "no_such_key_xyz", "invalid_request"},
		},
		{
			name:    "a write to stdout",
			subject: sdktest.Subject{Binary: self, Env: []string{brokenEnv + "=stdout"}},
			check:   "no_stdout",
			want:    []string{"to stdout", "debug: starting run sdktest-run-"},
		},
		{
			name:    "a 404 mapped to the wrong kind",
			subject: inProcess(func(a *testadapter.Adapter) sdk.Adapter { return wrong404{a} }),
			tweak:   func(o *sdktest.Options) { o.UnknownTarget = "missing" },
			check:   "error_mapping",
			want:    []string{`unknown target "missing"`, "kind upstream", "want kind model_not_found"},
		},
		{
			name:    "a tool choice ignored",
			subject: inProcess(func(a *testadapter.Adapter) sdk.Adapter { return ignoresToolChoice{a} }),
			check:   "tool_choice",
			want:    []string{"does not offer", "succeeded", "want kind invalid_request"},
		},
		{
			name:    "embedding dimensions ignored",
			subject: inProcess(func(a *testadapter.Adapter) sdk.Adapter { return ignoresDimensions{a} }),
			check:   "embed",
			want:    []string{"with dimensions 2", "kind upstream", "ignored dimensions", "want vectors of 2 values"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testadapterOptions()
			if tt.tweak != nil {
				tt.tweak(&o)
			}
			results := sdktest.Verify(t.Context(), tt.subject, o)
			for _, r := range results {
				if r.Name == tt.check {
					continue
				}
				if r.Status == sdktest.Fail {
					t.Errorf("check %s failed too: %s", r.Name, r.Message)
				}
			}
			r := result(t, results, tt.check)
			if r.Status != sdktest.Fail {
				t.Fatalf("check %s: %v %q; want it to fail", tt.check, r.Status, r.Message)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.Message, w) {
					t.Errorf("check %s failed with %q; want the message to say %q", tt.check, r.Message, w)
				}
			}
			t.Logf("%s: %s", tt.check, r.Message)
		})
	}
}

// A subject that is not set up fails every check, saying why; a binary
// that cannot start fails them with the start error.
func TestSubjectThatCannotStartFailsEveryCheck(t *testing.T) {
	for _, tt := range []struct {
		subject sdktest.Subject
		want    string
	}{
		{sdktest.Subject{}, "neither Adapter nor Binary"},
		{sdktest.Subject{Binary: filepath.Join(t.TempDir(), "missing")}, "no such file"},
	} {
		for _, r := range sdktest.Verify(t.Context(), tt.subject, testadapterOptions()) {
			if r.Status != sdktest.Fail || !strings.Contains(r.Message, tt.want) {
				t.Errorf("%v: check %s: %v %q; want a failure saying %q", tt.subject, r.Name, r.Status, r.Message, tt.want)
			}
		}
	}
}

// Check names select subtests: unique and without spaces.
func TestCheckNamesAreUniqueSubtestNames(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range sdktest.Checks() {
		if c.Name == "" || strings.ContainsAny(c.Name, " /") || seen[c.Name] || c.Doc == "" || c.Run == nil {
			t.Errorf("check %q (doc %q) is not a unique, runnable, documented subtest name", c.Name, c.Doc)
		}
		seen[c.Name] = true
	}
}

func result(t *testing.T, results []sdktest.Result, name string) sdktest.Result {
	t.Helper()
	for _, r := range results {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no result for check %s in %+v", name, results)
	return sdktest.Result{}
}
