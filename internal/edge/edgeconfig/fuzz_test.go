package edgeconfig

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// FuzzParse checks that no input panics Parse, that validation problems carry the line of their
// field (see yamlconf.Lines), that whatever Parse accepts is valid, and that a valid
// configuration marshals to a file that parses back to the same configuration. "The same" is
// compared as marshalled: an empty list (`targets: []`) and a list left out are one thing, which
// Marshal writes alike but reflect.DeepEqual tells apart.
func FuzzParse(f *testing.F) {
	examples, _ := filepath.Glob("../../../configs/edge*.yaml")
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
		loopbackFile + "  ca_fil: x\n",
		loopbackFile + "  mode: mtls\n",
		loopbackFile + "---\n",
		"listen: {quic: '[::1]:7443'}\nidentity: {mode: loopback}\n",
		"listen: {quic: '0.0.0.0:99999'}\n",
		"edge_id: &a x\nlog: {level: *a}\n",
		"identity: !!binary aGVsbG8=\n",
		"\xff\xfe",
		"identity:\n  mode: plaintext\n",
		"identity:\nedge_id: 'a b'\n",
		accessFile,
		strings.Replace(accessFile, "profile: batch", "profile: fast", 1),
		strings.Replace(accessFile, "http: '127.0.0.1:8080'", "http: '0.0.0.0:8080'", 1),
		loopbackFile + "api: {keys: []}\nroutes: [{name: r, model: m, targets: []}]\n",
		loopbackFile + "profiles: [{name: p, response_stall_timeout: 1500us}]\n",
		loopbackFile + "api: {allow_anonymous: false}\nprincipals: [{name: anonymous, routes: ['*']}]\n",
		loopbackFile + "routes: [{name: a, model: 'm:latest'}, {name: b, model: m}]\n",
		credentialFile,
		strings.Replace(credentialFile, "credential: upstream", "credential: openai", 1),
		strings.Replace(credentialFile, "kind: bearer", "kind: basic", 1),
		credentialFile + "  - {name: both, env: K, file: k}\n  - {name: neither}\n  - {name: upstream, env: 'sk-x'}\n",
		loopbackFile + "credentials: [{name: c, env: KEY}]\nprofiles: [{name: default, credential: c}]\n",
		loopbackFile + "credentials: [{name: c, file: ./k, kind: bearer}]\nprincipals: [{name: ops, routes: ['*'], admin: true}]\n",
		trustFile,
		strings.Replace(trustFile, "192.168.1.0/24", "0.0.0.0/0", 1),
		strings.Replace(trustFile, "192.168.1.0/24", "::ffff:10.0.0.0/104", 1),
		strings.Replace(trustFile, "127.0.0.2/32", "fd00::1/128", 1),
		strings.Replace(trustFile, "192.168.1.0/24", "64:ff9b::/96", 1),
		strings.Replace(trustFile, "192.168.1.0/24", "64:ff9b::c0a8:100/120", 1),
		strings.Replace(trustFile, "192.168.1.0/24", "2001:0:cb00:7101::/64", 1),
		strings.Replace(accessFile, "  allow_anonymous: true\n", "  allowed_hosts: [edge.lan, GPU-Box.local]\n  allowed_origins: ['https://chat.example', 'http://[::1]:5173']\n", 1),
		strings.Replace(accessFile, "  allow_anonymous: true\n", "  allowed_hosts: ['*', 'edge.lan:80', '', 127.0.0.1]\n  allowed_origins: ['*', 'null', 'https://a.example:443/', 'x']\n", 1),
		loopbackFile + "api: {tls: {cert_file: a}, trusted_networks: [{cidr: 10.0.0.1/8}]}\n",
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
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("Parse(Marshal(c)): %v\n%s", err, out)
		}
		again, err := yaml.Marshal(back)
		if err != nil {
			t.Fatalf("Marshal(Parse(Marshal(c))): %v", err)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("round trip changed the config:\n got %s\nwant %s", again, out)
		}
	})
}
