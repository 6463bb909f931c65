package leasepb_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The committed generated code is what `go generate` makes from lease.proto
// today. protoc comes from Debian's protobuf-compiler (.ci/run installs it);
// without it the check is skipped locally and fails in CI.
func TestGeneratedCodeIsFresh(t *testing.T) {
	if _, err := exec.LookPath("protoc"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("protoc is not installed; .ci/run installs protobuf-compiler")
		}
		t.Skip("protoc not installed (apt-get install protobuf-compiler); skipping the freshness check")
	}
	plugin, err := exec.Command("go", "tool", "-n", "protoc-gen-go").Output()
	if err != nil {
		t.Fatalf("go tool -n protoc-gen-go: %v", err)
	}
	out := t.TempDir()
	cmd := exec.Command("protoc", "--plugin=protoc-gen-go="+strings.TrimSpace(string(plugin)),
		"--go_out="+out, "--go_opt=paths=source_relative", "lease.proto")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, msg)
	}
	fresh, err := os.ReadFile(filepath.Join(out, "lease.pb.go"))
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("lease.pb.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh, committed) {
		t.Fatal("lease.pb.go is stale: run `go generate ./quicwire/lease/leasepb` and commit the result")
	}
}
