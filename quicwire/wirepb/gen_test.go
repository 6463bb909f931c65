package wirepb_test

import (
	"testing"

	"github.com/iop-dev/iop/quicwire/internal/protofresh"
)

// The committed generated code is what `go generate` makes from wire.proto
// today.
func TestGeneratedCodeIsFresh(t *testing.T) {
	protofresh.Check(t, "wire.proto", "go generate ./quicwire/...")
}
