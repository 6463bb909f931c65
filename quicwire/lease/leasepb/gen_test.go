package leasepb_test

import (
	"testing"

	"github.com/iop-dev/iop/quicwire/internal/protofresh"
)

// The committed generated code is what `go generate` makes from lease.proto
// today.
func TestGeneratedCodeIsFresh(t *testing.T) {
	protofresh.Check(t, "lease.proto", "go generate ./quicwire/...")
}
