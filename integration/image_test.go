package integration

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The Dockerfile builds with CGO_ENABLED=0 for a distroless static image:
// the binaries must need no dynamic loader, and the health check commands
// the images run must exist. (No Docker engine runs here; this checks what
// the image is made of.)
func TestImageBinariesAreStaticAndHaveTheirHealthcheck(t *testing.T) {
	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"ENV CGO_ENABLED=0", "USER nonroot:nonroot", "AS edged", "AS noded",
		`"/usr/local/bin/edged", "healthcheck"`, `"/usr/local/bin/noded", "healthcheck"`,
	} {
		if !strings.Contains(string(df), want) {
			t.Errorf("Dockerfile lacks %s", want)
		}
	}
	dir := t.TempDir()
	for _, d := range []string{"edged", "noded"} {
		out := filepath.Join(dir, d)
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=test", "-o", out, "../"+d)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", d, err, msg)
		}
		f, err := elf.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("%s is dynamically linked (%v): it would not run on distroless/static", d, p.Type)
			}
		}
		f.Close()
		if msg, err := exec.Command(out, "version").CombinedOutput(); err != nil || strings.TrimSpace(string(msg)) != d+" test" {
			t.Errorf("%s version: %q %v", d, msg, err)
		}
		// Nothing listens on this port: the health check must fail, not hang.
		if msg, err := exec.Command(out, "healthcheck", "--url", "http://127.0.0.1:1/healthz").CombinedOutput(); err == nil {
			t.Errorf("%s healthcheck against a closed port succeeded: %s", d, msg)
		}
	}
}
