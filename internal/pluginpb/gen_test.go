package pluginpb_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The committed generated code is what `go generate` makes from
// adapter.proto today. protoc comes from Debian's protobuf-compiler
// (.ci/run installs it); without it the check is skipped locally and fails
// in CI.
func TestGeneratedCodeIsFresh(t *testing.T) {
	if _, err := exec.LookPath("protoc"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("protoc is not installed; .ci/run installs protobuf-compiler")
		}
		t.Skip("protoc not installed (apt-get install protobuf-compiler); skipping the freshness check")
	}
	tool := func(name string) string {
		out, err := exec.Command("go", "tool", "-n", name).Output()
		if err != nil {
			t.Fatalf("go tool -n %s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	out := t.TempDir()
	cmd := exec.Command("protoc", "-I", ".",
		"--plugin=protoc-gen-go="+tool("protoc-gen-go"),
		"--plugin=protoc-gen-go-grpc="+tool("protoc-gen-go-grpc"),
		"--go_out="+out, "--go_opt=paths=source_relative",
		"--go-grpc_out="+out, "--go-grpc_opt=paths=source_relative",
		"internal/pluginpb/adapter.proto")
	cmd.Dir = filepath.Join("..", "..")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, msg)
	}
	for _, name := range []string{"adapter.pb.go", "adapter_grpc.pb.go"} {
		fresh, err := os.ReadFile(filepath.Join(out, "internal", "pluginpb", name))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(fresh, committed) {
			t.Errorf("%s is stale: run `go generate ./sdk/...` and commit the result", name)
		}
	}
}
