package nodeconfig

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// FuzzParse checks that no input panics Parse, that validation problems carry the line of their
// field (see yamlconf.Lines), that whatever Parse accepts is valid, and that a valid
// configuration marshals to a file that parses again. (Equality after the round trip is not
// checked: free-form adapter config may hold values such as NaN that compare unequal.)
func FuzzParse(f *testing.F) {
	examples, _ := filepath.Glob("../../../configs/node*.yaml")
	if len(examples) == 0 {
		f.Fatal("no example configurations to seed from (configs/ moved?)")
	}
	for _, name := range examples {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		loopbackFile,
		loopbackFile + "    capcity: 3\n",
		loopbackFile + "    capacity: 0\n",
		loopbackFile + "    adapter: openai\n",
		loopbackFile + "    config: {a: &x [1, *x]}\n",
		loopbackFile + "    config: {when: 2001-12-14, big: 18446744073709551615, f: .nan, b: !!binary aGVsbG8=}\n",
		loopbackFile + "drain_timeout: 30\n",
		loopbackFile + "labels: {a: 1, b: true}\n",
		"node_id: n\nedge: {address: '127.0.0.1:1'}\nidentity: {mode: loopback}\nproviders: [{name: x, adapter: external, binary: /x, sha256: " +
			"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef}]\n",
		"providers:\n- <<: {name: a}\n",
		"node_id: n\nedge: {addresses: ['127.0.0.1:1', '127.0.0.1:2']}\nidentity: {mode: loopback}\n",
		"node_id: n\nedge: {address: 'a:1', addresses: ['a:1', 'b']}\nidentity: {edge_id: e}\n",
		loopbackFile + "  -\n    name: third\n",
		loopbackFile + "labels: {\"a b\": x, \"q[\\\"].x\": y}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			var e *yamlconf.Error
			if c != nil || !errors.As(err, &e) {
				t.Fatalf("Parse = %v, %v; want nil and a *yamlconf.Error", c, err)
			}
			// When the file decodes, the problems are Validate's: each must point at the line
			// of its field, or of the nearest enclosing field the file sets.
			if lines, decodeErr := yamlconf.DecodeWithLines(data, &Config{}); decodeErr == nil {
				var es yamlconf.Errors
				errors.As(err, &es)
				for _, e := range es {
					if want := lines.Line(e.Path); e.Line != want {
						t.Fatalf("%v: want line %d", e, want)
					}
				}
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted an invalid config: %v", err)
		}
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		if _, err := Parse(out); err != nil {
			t.Fatalf("Parse(Marshal(c)): %v\n%s", err, out)
		}
	})
}
