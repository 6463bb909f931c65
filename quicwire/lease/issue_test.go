package lease_test

import (
	"bytes"
	"crypto/ed25519"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/quicwire/lease"
)

// R11: what the Edge issues, the Node opens unchanged.
func TestIssueThenOpenGivesTheSameClaimsAndSecret(t *testing.T) {
	c := claims("lease-1")
	c.IssuedAt = t0.Add(123456 * time.Nanosecond) // carried to the millisecond
	sealed := issue(t, c)
	if len(sealed) > lease.MaxSealedSize {
		t.Fatalf("sealed lease is %d bytes", len(sealed))
	}
	l, err := newOpener(newClock(t0.Add(time.Second))).Open(sealed, binding())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	want := c
	want.IssuedAt = t0
	if l.ID != want.ID || l.Binding != want.Binding || l.Credential != want.Credential || l.Revision != want.Revision ||
		!l.IssuedAt.Equal(want.IssuedAt) || !l.ExpiresAt.Equal(want.ExpiresAt) {
		t.Fatalf("claims:\n got %+v\nwant %+v", l.Claims, want)
	}
	if string(l.Secret) != testSecret {
		t.Fatal("secret differs")
	}
	secret := l.Secret
	l.Wipe()
	if l.Secret != nil || !bytes.Equal(secret, make([]byte, len(secret))) {
		t.Fatal("Wipe left the secret")
	}
}

func TestIssueRefusesWhatAnOpenerWouldRefuse(t *testing.T) {
	big := strings.Repeat("x", lease.MaxSealedSize)
	for _, tc := range []struct {
		name   string
		edit   func(*lease.Claims)
		secret []byte
	}{
		{"empty id", func(c *lease.Claims) { c.ID = "" }, nil},
		{"id too long", func(c *lease.Claims) { c.ID = strings.Repeat("i", lease.MaxIDSize+1) }, nil},
		{"no node id", func(c *lease.Claims) { c.NodeID = "" }, nil},
		{"no provider", func(c *lease.Claims) { c.Provider = "" }, nil},
		{"no credential", func(c *lease.Claims) { c.Credential = "" }, nil},
		{"generation 0", func(c *lease.Claims) { c.Generation = 0 }, nil},
		{"no issue time", func(c *lease.Claims) { c.IssuedAt = time.Time{} }, nil},
		{"expires at issue", func(c *lease.Claims) { c.ExpiresAt = c.IssuedAt }, nil},
		{"expires before issue", func(c *lease.Claims) { c.ExpiresAt = c.IssuedAt.Add(-time.Second) }, nil},
		{"expires within the same millisecond", func(c *lease.Claims) { c.ExpiresAt = c.IssuedAt.Add(time.Microsecond) }, nil},
		{"lives too long", func(c *lease.Claims) { c.ExpiresAt = c.IssuedAt.Add(lease.MaxLifetime + time.Millisecond) }, nil},
		{"invalid UTF-8", func(c *lease.Claims) { c.Principal = "\xff" }, nil},
		{"over the size limit", func(c *lease.Claims) { c.Route = big }, nil},
		{"empty secret", func(*lease.Claims) {}, []byte{}},
		{"secret too large", func(*lease.Claims) {}, make([]byte, lease.MaxSecretSize+1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := claims("lease-1")
			tc.edit(&c)
			secret := tc.secret
			if secret == nil {
				secret = []byte(testSecret)
			}
			if sealed, err := lease.NewIssuer(edgeKey).Issue(c, secret, &node.pub); err == nil {
				t.Fatalf("issued %d bytes", len(sealed))
			} else if strings.Contains(err.Error(), testSecret) {
				t.Fatalf("error shows the secret: %v", err)
			}
		})
	}
	if _, err := lease.NewIssuer(edgeKey).Issue(claims("lease-1"), []byte(testSecret), nil); err == nil {
		t.Fatal("issued without a recipient")
	}
	// The limits themselves are fine.
	c := claims(strings.Repeat("i", lease.MaxIDSize))
	c.ExpiresAt = c.IssuedAt.Add(lease.MaxLifetime)
	if _, err := lease.NewIssuer(edgeKey).Issue(c, make([]byte, lease.MaxSecretSize), &node.pub); err != nil {
		t.Fatalf("at the limits: %v", err)
	}
}

func TestNewOpenerRefusesProgrammingErrors(t *testing.T) {
	for name, cfg := range map[string]lease.OpenerConfig{
		"no key":             {},
		"mismatched public":  {Key: &node.priv, Public: &otherNode.pub},
		"public without key": {Public: &node.pub},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			lease.NewOpener(cfg)
		})
	}
	defer func() {
		if recover() == nil {
			t.Fatal("NewIssuer with a short key: no panic")
		}
	}()
	lease.NewIssuer(ed25519.PrivateKey{1})
}
