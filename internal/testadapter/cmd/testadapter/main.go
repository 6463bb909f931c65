// Command testadapter serves the SDK's scriptable test adapter as a plugin.
// IOP_TESTADAPTER_VARIANT=minimal serves the variant without optional
// capabilities.
package main

import (
	"os"

	"github.com/iop-dev/iop/internal/testadapter"
	"github.com/iop-dev/iop/sdk"
)

func main() {
	if os.Getenv("IOP_TESTADAPTER_VARIANT") == "minimal" {
		sdk.Serve(testadapter.NewMinimal())
	}
	sdk.Serve(testadapter.New())
}
