package enroll

import (
	"bytes"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
)

func newToken(t testing.TB) Token {
	t.Helper()
	id := make([]byte, TokenIDSize)
	secret := make([]byte, TokenSecretSize)
	hash := make([]byte, CAHashSize)
	rand.Read(id)
	rand.Read(secret)
	rand.Read(hash)
	return Token{ID: b64.EncodeToString(id), Secret: secret, CAHash: hash}
}

func TestTokenRoundTrips(t *testing.T) {
	tok := newToken(t)
	s := tok.String()
	if !strings.HasPrefix(s, TokenPrefix+".") || len(s) > 90 {
		t.Errorf("token %q: want a short iop1. string", s)
	}
	got, err := ParseToken("  " + s + "\n") // pasted with whitespace
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != tok.ID || !bytes.Equal(got.Secret, tok.Secret) || !bytes.Equal(got.CAHash, tok.CAHash) {
		t.Errorf("parsed %+v, want %+v", got, tok)
	}
}

func TestMalformedTokensAreRefusedWithTheReason(t *testing.T) {
	good := newToken(t).String()
	parts := strings.Split(good, ".")
	for _, tc := range []struct{ name, token, want string }{
		{"empty", "", "4 parts"},
		{"three parts", strings.Join(parts[:3], "."), "4 parts"},
		{"five parts", good + ".x", "4 parts"},
		{"other version", "iop2." + strings.Join(parts[1:], "."), `unsupported token version "iop2"`},
		{"short id", parts[0] + ".abc." + strings.Join(parts[2:], "."), "id: want 8"},
		{"padded secret", strings.Join(parts[:2], ".") + "." + parts[2] + "==." + parts[3], "secret: want 22"},
		{"not base64url", strings.Join(parts[:3], ".") + "." + strings.Repeat("+", len(parts[3])), "CA hash: not base64url"},
		{"huge", strings.Repeat("a", 1000), "1000 characters"},
		// encoding/base64 skips line breaks: a token with them inside is
		// another spelling of a shorter secret (found by the fuzzer).
		{"line breaks inside", strings.Join(parts[:2], ".") + "." + parts[2][:11] + "\r" + parts[2][12:15] + "\r" + parts[2][16:] + "." + parts[3], "secret: not base64url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseToken(tc.token)
			if !errors.Is(err, ErrMalformedToken) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseToken(%q) = %v, want ErrMalformedToken saying %q", tc.token, err, tc.want)
			}
		})
	}
}

func TestSecretMatchesOnlyItsHash(t *testing.T) {
	tok := newToken(t)
	stored := SecretHash(tok.Secret)
	if !SecretMatches(tok.Secret, stored) {
		t.Error("the secret does not match its own hash")
	}
	other := bytes.Clone(tok.Secret)
	other[0] ^= 1
	if SecretMatches(other, stored) || SecretMatches(tok.Secret, stored[:10]) || SecretMatches(nil, nil) {
		t.Error("a wrong secret or a truncated hash matched")
	}
}

// FuzzParseToken: the parser never panics, and what it accepts is one
// canonical spelling: it prints back as itself.
func FuzzParseToken(f *testing.F) {
	f.Add(newToken(f).String())
	f.Add("iop1.AAAAAAAA.AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Add("iop1...")
	f.Add("iop1.A.B.C")
	f.Add("iop1.AAAAAAAA.AAAAAAAAAAAAAAAAAAAAAB.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB")
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ParseToken(s)
		if err != nil {
			if !errors.Is(err, ErrMalformedToken) {
				t.Fatalf("error %v is not ErrMalformedToken", err)
			}
			return
		}
		if got := tok.String(); got != strings.TrimSpace(s) {
			t.Fatalf("ParseToken(%q) accepted a non-canonical spelling; prints as %q", s, got)
		}
		if len(tok.Secret) != TokenSecretSize || len(tok.CAHash) != CAHashSize || !ValidTokenID(tok.ID) {
			t.Fatalf("ParseToken(%q) = %+v: wrong sizes", s, tok)
		}
	})
}
