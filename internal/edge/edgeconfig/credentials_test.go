package edgeconfig

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// credentialFile is accessFile on a managed Edge, with two credentials, the batch profile using
// one of them and alice an admin; the tests that give lines count on its layout.
var credentialFile = strings.Replace(strings.Replace(strings.Replace(accessFile,
	"identity: {mode: loopback}", "identity: {ca_file: /ca.pem, cert_file: /edge.pem, key_file: /edge-key.pem}", 1),
	`{name: alice, routes: ["*"]}`, `{name: alice, routes: ["*"], admin: true}`, 1),
	"    queue_timeout: 0s\n", "    queue_timeout: 0s\n    credential: upstream\n", 1) + `credentials:
  - name: upstream
    env: OPENAI_API_KEY
  - name: backup
    file: secrets/backup.key
    kind: bearer
`

// credentialConfig is accessConfig with the credentials of credentialFile.
func credentialConfig() *Config {
	c := accessConfig()
	c.Principals[0].Admin = true
	c.Profiles[1].Credential = "upstream"
	c.Credentials = []Credential{
		{Name: "upstream", Env: "OPENAI_API_KEY", Kind: CredentialKindBearer},
		{Name: "backup", File: "/run/secrets/backup.key", Kind: CredentialKindBearer},
	}
	return c
}

func TestParseReadsCredentials(t *testing.T) {
	c := mustParse(t, credentialFile)
	want := []Credential{
		{Name: "upstream", Env: "OPENAI_API_KEY", Kind: CredentialKindBearer}, // kind defaults to bearer
		{Name: "backup", File: "secrets/backup.key", Kind: CredentialKindBearer},
	}
	if !reflect.DeepEqual(c.Credentials, want) {
		t.Errorf("credentials %+v\nwant %+v", c.Credentials, want)
	}
	if c.Profile("batch").Credential != "upstream" || c.Profile("default").Credential != "" {
		t.Errorf("profiles %+v: want batch on upstream and default without a credential", c.Profiles)
	}
	if !c.Principals[0].Admin || c.Principals[1].Admin {
		t.Errorf("principals %+v: want alice an admin and bob not", c.Principals)
	}
	if cr, ok := c.Credential("backup"); !ok || cr.Source() != "file:secrets/backup.key" {
		t.Errorf("Credential(backup) = %+v, %v", cr, ok)
	}
	if cr, _ := c.Credential("upstream"); cr.Source() != "env:OPENAI_API_KEY" {
		t.Errorf("upstream source = %q", cr.Source())
	}
	if _, ok := c.Credential("nope"); ok {
		t.Error("Credential(nope) found something")
	}
}

func TestValidateCredentials(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *Config)
		path   string
		reason string
	}{
		{"unknown credential", func(c *Config) { c.Profiles[1].Credential = "x" }, "profiles[1].credential",
			`no credential named "x"; configured: upstream, backup`},
		{"unknown credential, none configured", func(c *Config) { c.Credentials = nil; c.Profiles[0].Credential = "x"; c.Profiles[1].Credential = "" },
			"profiles[0].credential", `no credential named "x"; none is configured (define it under credentials)`},
		{"neither env nor file", func(c *Config) { c.Credentials[0].Env = "" }, "credentials[0]",
			"set env (an environment variable) or file (a path) to say where the value is read from"},
		{"both env and file", func(c *Config) { c.Credentials[1].Env = "BACKUP_KEY" }, "credentials[1]", "set env or file, not both"},
		{"duplicate name", func(c *Config) { c.Credentials[1].Name = "upstream" }, "credentials[1].name", `duplicate credential "upstream" (first at credentials[0])`},
		{"name required", func(c *Config) { c.Credentials[1].Name = "" }, "credentials[1].name", "required"},
		{"name charset", func(c *Config) { c.Credentials[1].Name = "back up" }, "credentials[1].name", "must be 1 to 128 characters"},
		{"bad kind", func(c *Config) { c.Credentials[0].Kind = "basic" }, "credentials[0].kind", `must be one of bearer; got "basic"`},
		{"empty kind", func(c *Config) { c.Credentials[0].Kind = "" }, "credentials[0].kind", `must be one of bearer; got ""`},
		{"env with a dash", func(c *Config) { c.Credentials[0].Env = "OPENAI-KEY" }, "credentials[0].env",
			"must be the name of an environment variable (letters, digits and '_', not starting with a digit, at most 256), not its value; got 10 characters"},
		{"env starting with a digit", func(c *Config) { c.Credentials[0].Env = "1KEY" }, "credentials[0].env", "not starting with a digit"},
		{"env too long", func(c *Config) { c.Credentials[0].Env = strings.Repeat("K", 257) }, "credentials[0].env", "got 257 characters"},
		{"file with a NUL", func(c *Config) { c.Credentials[1].File = "/run/a\x00b" }, "credentials[1].file", "cannot contain a NUL byte"},
		// SPEC S3: a lease sealed to an unauthenticated Node could go to anyone.
		{"credential in loopback mode", func(c *Config) { toLoopback(c); c.Listen.QUIC = "127.0.0.1:7443" }, "profiles[1].credential",
			"credential leases need identity.mode mtls (managed mode): in loopback mode Nodes are not authenticated"},
		{"unknown credential in loopback mode", func(c *Config) { toLoopback(c); c.Listen.QUIC = "127.0.0.1:7443"; c.Profiles[1].Credential = "x" },
			"profiles[1].credential", "credential leases need identity.mode mtls"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := credentialConfig()
			tt.change(c)
			wantOneProblem(t, c.Validate(), tt.path, tt.reason)
		})
	}
}

func TestValidateAcceptsCredentialVariants(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *Config)
	}{
		{"the base", func(*Config) {}},
		{"credentials no profile uses", func(c *Config) { c.Profiles[1].Credential = "" }},
		// Unused credentials are fine in loopback mode: nothing is ever leased.
		{"unused credentials in loopback mode", func(c *Config) {
			toLoopback(c)
			c.Listen.QUIC = "127.0.0.1:7443"
			c.Profiles[1].Credential = ""
		}},
		{"two profiles on one credential", func(c *Config) { c.Profiles[0].Credential = "upstream" }},
		{"relative file", func(c *Config) { c.Credentials[1].File = "secrets/backup.key" }},
		{"underscore env", func(c *Config) { c.Credentials[0].Env = "_K_2" }},
		{"admin principal without keys", func(c *Config) { c.API.Keys = c.API.Keys[1:] }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := credentialConfig()
			tt.change(c)
			if err := c.Validate(); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestValidateDoesNotEchoASecretPastedAsItsSource(t *testing.T) {
	c := credentialConfig()
	c.Credentials[0].Env = "sk-live-secret-value"
	err := c.Validate()
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("Validate = %v; want a problem that does not repeat the value", err)
	}
}

func TestParseReportsCredentialProblemsWithLines(t *testing.T) {
	type problem struct {
		path string
		line int
	}
	tests := []struct {
		name  string
		src   string
		want  []problem
		first string
	}{
		{"unknown credential", strings.Replace(credentialFile, "credential: upstream", "credential: openai", 1), []problem{{"profiles[1].credential", 24}},
			`profiles[1].credential (line 24): no credential named "openai"; configured: upstream, backup`},
		{"both sources", strings.Replace(credentialFile, "    kind: bearer\n", "    env: BACKUP\n", 1), []problem{{"credentials[1]", 37}},
			"credentials[1] (line 37): set env or file, not both"},
		{"bad kind", strings.Replace(credentialFile, "kind: bearer", "kind: basic", 1), []problem{{"credentials[1].kind", 39}}, ""},
		{"duplicate name", strings.Replace(credentialFile, "name: backup", "name: upstream", 1), []problem{{"credentials[1].name", 37}}, ""},
		{"loopback mode", strings.Replace(credentialFile, "identity: {ca_file: /ca.pem, cert_file: /edge.pem, key_file: /edge-key.pem}", "identity: {mode: loopback}", 1),
			[]problem{{"profiles[1].credential", 24}}, "profiles[1].credential (line 24): credential leases need identity.mode mtls (managed mode)"},
		{"unknown field", credentialFile + "    secret: x\n", []problem{{"credentials[1].secret", 40}}, "credentials[1].secret (line 40): unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.src))
			var es yamlconf.Errors
			if !errors.As(err, &es) {
				t.Fatalf("Parse error %v is not a yamlconf.Errors", err)
			}
			var got []problem
			for _, e := range es {
				got = append(got, problem{e.Path, e.Line})
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("problems %v\nwant     %v\n%v", got, tt.want, err)
			}
			if tt.first != "" && !strings.HasPrefix(es[0].Error(), tt.first) {
				t.Errorf("first problem %q, want it to start %q", es[0], tt.first)
			}
		})
	}
}

func TestLoadResolvesCredentialFilesAgainstTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.yaml")
	src := credentialFile + "  - {name: abs, file: /run/secrets/abs}\n"
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	got := []string{c.Credentials[0].File, c.Credentials[1].File, c.Credentials[2].File}
	want := []string{"", filepath.Join(dir, "secrets", "backup.key"), "/run/secrets/abs"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("files %q, want %q (env credentials keep no file)", got, want)
	}
}

func TestExamplesShowCredentialsInManagedModeOnly(t *testing.T) {
	managed, err := Load("../../../configs/edge-managed.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(managed.Credentials) == 0 {
		t.Fatal("managed: no credentials")
	}
	var used, admin bool
	for _, p := range managed.Profiles {
		if _, ok := managed.Credential(p.Credential); ok {
			used = true
		}
	}
	for _, p := range managed.Principals {
		admin = admin || p.Admin
	}
	if !used || !admin {
		t.Errorf("managed: a profile using a credential %v, an admin principal %v; want both", used, admin)
	}

	dev, err := Load("../../../configs/edge-dev.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(dev.Credentials) != 0 {
		t.Errorf("dev (loopback): %d credentials", len(dev.Credentials))
	}
}
