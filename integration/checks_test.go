package integration

import (
	"os/exec"
	"strings"
	"testing"
)

// The source is gofmt-clean, vet-clean and staticcheck-clean (staticcheck is
// pinned as a tool in go.mod). These run as a test so that `go test ./...`
// is the whole check.
func TestSourceIsFormattedVettedAndStaticchecked(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: runs go vet and staticcheck over the module")
	}
	for _, c := range [][]string{
		{"gofmt", "-l", "."},
		{"go", "vet", "./..."},
		{"go", "tool", "staticcheck", "./..."},
	} {
		cmd := exec.Command(c[0], c[1:]...)
		cmd.Dir = ".."
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("%s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
}
