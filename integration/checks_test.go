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
		if findings := withoutDownloads(string(out)); err != nil || findings != "" {
			t.Errorf("%s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
}

// withoutDownloads drops the go command's "go: downloading ..." progress
// lines (printed on a machine with a cold module cache), leaving findings.
func withoutDownloads(out string) string {
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != "" && !strings.HasPrefix(l, "go: downloading ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
