package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The Node links no Edge code.
func TestNodedLinksNoEdgeCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if f := "github.com/iop-dev/iop/internal/edge"; dep == f || strings.HasPrefix(dep, f+"/") {
			t.Errorf("noded depends on %s", dep)
		}
	}
}
