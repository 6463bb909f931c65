package edgeconfig

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// ParseOllamaKey parses one entry of a principal's ollama_keys: a single authorized_keys line
// holding an Ed25519 public key and, optionally, a comment ("ssh-ed25519 AAAA... user@host"),
// which is returned to name the key in logs.
//
// Only Ed25519: Ollama makes and reads ~/.ollama/id_ed25519 alone, and its client sends the
// bare signature blob without the algorithm, so the Edge verifies with the key's own algorithm;
// for an RSA key that would be SHA-1. authorized_keys options (from=, command=...) are refused
// rather than ignored: an operator who writes from="10.0.0.0/8" expects it to be enforced.
func ParseOllamaKey(line string) (ssh.PublicKey, string, error) {
	line = strings.TrimSpace(line)
	switch {
	case line == "":
		return nil, "", errors.New("required: a public key line such as \"ssh-ed25519 AAAA... user@host\" (cat ~/.ollama/id_ed25519.pub)")
	case strings.Contains(line, "PRIVATE KEY"):
		// Never echoed: it is a secret.
		return nil, "", errors.New("this is a private key; list the public key (cat ~/.ollama/id_ed25519.pub), and keep the private one out of this file")
	}
	pub, comment, options, rest, err := ssh.ParseAuthorizedKey([]byte(line))
	switch {
	case err != nil:
		return nil, "", fmt.Errorf("not a public key line such as \"ssh-ed25519 AAAA... user@host\" (cat ~/.ollama/id_ed25519.pub): %w", err)
	case len(options) > 0:
		return nil, "", fmt.Errorf("authorized_keys options are not supported (got %s): write the key line alone", strings.Join(options, ","))
	case len(strings.TrimSpace(string(rest))) > 0:
		return nil, "", errors.New("one key per entry: list each key as its own entry")
	case pub.Type() != ssh.KeyAlgoED25519:
		return nil, "", fmt.Errorf("must be an %s key, as Ollama's ~/.ollama/id_ed25519.pub is; got %s", ssh.KeyAlgoED25519, pub.Type())
	}
	return pub, comment, nil
}

// checkOllamaKeys checks one principal's ollama_keys: each a key ParseOllamaKey accepts, none
// listed twice here or under another principal (seen maps a key's wire form to the path of its
// first entry, across principals): a key identifies one principal.
func checkOllamaKeys(path string, lines []string, seen map[string]string) yamlconf.Errors {
	var es yamlconf.Errors
	for i, line := range lines {
		p := fmt.Sprintf("%s[%d]", path, i)
		pub, _, err := ParseOllamaKey(line)
		if err != nil {
			es.Add(p, "%s", err.Error())
			continue
		}
		wire := string(pub.Marshal())
		if first := seen[wire]; first != "" {
			es.Add(p, "the same key as %s; a key identifies one principal", first)
			continue
		}
		seen[wire] = p
	}
	return es
}
