package edgeconfig

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// pubLine is the authorized_keys line of a new key of the kind of priv, with comment.
func pubLine(t *testing.T, priv any, comment string) string {
	t.Helper()
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))) + comment
}

func newEd25519(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return priv
}

// A principal's ollama_keys are the lines of ~/.ollama/id_ed25519.pub (issue 23): parsed with
// their comment, and read from YAML.
func TestOllamaKeysAreAuthorizedKeysLines(t *testing.T) {
	line := pubLine(t, newEd25519(t), " alice@laptop")
	pub, comment, err := ParseOllamaKey("  " + line + "\n")
	if err != nil || comment != "alice@laptop" || pub.Type() != ssh.KeyAlgoED25519 {
		t.Fatalf("ParseOllamaKey = %v, %q, %v", pub, comment, err)
	}
	if _, comment, err := ParseOllamaKey(strings.TrimSuffix(line, " alice@laptop")); err != nil || comment != "" {
		t.Fatalf("without a comment: %q, %v", comment, err)
	}
	c, err := Parse([]byte(strings.Replace(accessFile, "  - {name: alice, routes: [\"*\"]}",
		"  - {name: alice, routes: [\"*\"], admin: true, ollama_keys: [\""+line+"\"]}", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Principals[0].OllamaKeys; len(got) != 1 || got[0] != line {
		t.Errorf("principals[0].ollama_keys = %q, want [%q]", got, line)
	}
}

func TestValidateOllamaKeys(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	ed := pubLine(t, newEd25519(t), " a@b")
	tests := []struct {
		name   string
		keys   [2][]string // alice's, bob's
		path   string
		reason string
	}{
		{"empty", [2][]string{{""}}, "principals[0].ollama_keys[0]", "required: a public key line"},
		{"not a key", [2][]string{nil, {ed, "ssh-ed25519 AAAAnope"}}, "principals[1].ollama_keys[1]", "not a public key line"},
		{"an RSA key", [2][]string{{pubLine(t, rsaKey, "")}}, "principals[0].ollama_keys[0]", "must be an ssh-ed25519 key, as Ollama's ~/.ollama/id_ed25519.pub is; got ssh-rsa"},
		{"options", [2][]string{{`from="10.0.0.0/8" ` + ed}}, "principals[0].ollama_keys[0]", "authorized_keys options are not supported (got from=\"10.0.0.0/8\")"},
		{"two keys in one entry", [2][]string{{ed + "\n" + pubLine(t, newEd25519(t), "")}}, "principals[0].ollama_keys[0]", "one key per entry"},
		{"the private key", [2][]string{{"-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn...\n-----END OPENSSH PRIVATE KEY-----"}},
			"principals[0].ollama_keys[0]", "this is a private key"},
		{"twice for one principal", [2][]string{{ed, ed}}, "principals[0].ollama_keys[1]", "the same key as principals[0].ollama_keys[0]"},
		{"under two principals", [2][]string{{ed}, {strings.TrimSuffix(ed, " a@b") + " other comment"}}, "principals[1].ollama_keys[0]",
			"the same key as principals[0].ollama_keys[0]; a key identifies one principal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := accessConfig()
			c.Principals[0].OllamaKeys, c.Principals[1].OllamaKeys = tt.keys[0], tt.keys[1]
			wantOneProblem(t, c.Validate(), tt.path, tt.reason)
		})
	}
	c := accessConfig()
	c.Principals[0].OllamaKeys = []string{ed}
	if err := c.Validate(); err != nil {
		t.Errorf("a valid key: %v", err)
	}
}
