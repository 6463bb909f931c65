// Package builtin lists the adapters compiled into the IOP binaries. The
// Node starts one as a plugin process by re-executing its own binary with
// `plugin NAME`, so a single binary serves a user (ARCHITECTURE.md
// decision 7); third-party adapters are separate binaries.
package builtin

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/iop-dev/iop/plugins/ollama"
	"github.com/iop-dev/iop/plugins/openai"
	"github.com/iop-dev/iop/plugins/simulator"
	"github.com/iop-dev/iop/sdk"
)

var adapters = map[string]func() sdk.Adapter{
	"ollama":    func() sdk.Adapter { return ollama.New() },
	"openai":    func() sdk.Adapter { return openai.New() },
	"simulator": func() sdk.Adapter { return simulator.New() },
}

// Names lists the built-in adapters, sorted.
func Names() []string {
	names := make([]string, 0, len(adapters))
	for n := range adapters {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Has reports whether name is a built-in adapter.
func Has(name string) bool { _, ok := adapters[name]; return ok }

// New returns a new instance of the built-in adapter name.
func New(name string) (sdk.Adapter, error) {
	f, ok := adapters[name]
	if !ok {
		return nil, fmt.Errorf("no built-in adapter %q (built in: %s)", name, strings.Join(Names(), ", "))
	}
	return f(), nil
}

// Serve serves the built-in adapter name as a plugin process; it is what
// `noded plugin NAME` runs. It does not return on success. With describe,
// it prints the adapter's info and capabilities as JSON instead, as a
// third-party adapter does when run with `describe`.
func Serve(name string, describe bool) error {
	a, err := New(name)
	if err != nil {
		return err
	}
	if describe {
		return sdk.Describe(os.Stdout, a)
	}
	sdk.Serve(a)
	return nil
}
