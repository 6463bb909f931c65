// Package protofresh checks that committed protobuf code is what `go
// generate` makes today: the generated-code freshness check of the wire
// packages. protoc comes from Debian's protobuf-compiler (.ci/run installs
// it); without it the check is skipped locally and fails in CI.
package protofresh

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Check runs protoc with the pinned protoc-gen-go on proto (a file in the
// test's package directory) and fails t when the committed .pb.go beside it
// differs. regen is the command that fixes it, for the failure message.
func Check(t *testing.T, proto, regen string) {
	t.Helper()
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
		"--go_out="+out, "--go_opt=paths=source_relative", proto)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, msg)
	}
	gen := strings.TrimSuffix(proto, ".proto") + ".pb.go"
	fresh, err := os.ReadFile(filepath.Join(out, gen))
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(gen)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh, committed) {
		t.Fatalf("%s is stale: run `%s` and commit the result", gen, regen)
	}
}
