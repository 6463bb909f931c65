package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The production Edge links no Node code: no Node runtime, no plugin host,
// no adapters, no SDK. The all-in-one command that does is edged/dev.
func TestEdgedLinksNoNodeCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{
		"github.com/iop-dev/iop/internal/node",
		"github.com/iop-dev/iop/internal/pluginhost",
		"github.com/iop-dev/iop/internal/pluginpb",
		"github.com/iop-dev/iop/plugins",
		"github.com/iop-dev/iop/sdk",
		"github.com/hashicorp/go-plugin",
		"google.golang.org/grpc",
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				t.Errorf("edged depends on %s", dep)
			}
		}
	}
}
