// Package enroll is how a Node gets its identity from the Edge it joins:
// the join token, the CA's discovery hash, and the join exchange on its own
// ALPN (see JoinALPN), in the manner of `kubeadm join`.
//
// The conversation:
//
//	operator on the Edge: edged node add gpu-1   → token iop1.ID.SECRET.CAHASH
//	Node: noded join EDGE-ADDR --token T
//	 │ makes its key; dials EDGE-ADDR over QUIC with ALPN iop-join/1 and
//	 │ no client certificate; trusts the Edge only if the chain it presents
//	 │ holds a CA whose SubjectPublicKeyInfo hashes to CAHASH and that CA
//	 │ signed the Edge's (edge identity) certificate
//	 │── JoinRequest{token id, secret, CSR} ────────────────────────►│ token known, unused,
//	 │                                                               │ unexpired, secret matches:
//	 │                                                               │ marked used, certificate
//	 │◄─ JoinResponse{node id, trust domain, edge id, chain} ────────│ issued for the token's node
//	 │ writes key, certificate, CA and config; may start serving     │
//
// The private key never leaves the Node. The secret crosses only to an Edge
// already proven to hold the CA of the token, and the Edge keeps only its
// SHA-256. After joining, the Node renews its certificate on its ordinary
// authenticated connection (CertificateRequest on the control stream).
package enroll

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// TokenPrefix is the version of the token format. A later format gets
// another prefix, so an old Node says "unsupported token version" rather
// than misreading it.
const TokenPrefix = "iop1"

// Sizes of a token's parts, in bytes before base64url encoding.
const (
	TokenIDSize     = 6  // names the token in the Edge's store and in logs; not secret
	TokenSecretSize = 16 // 128 bits: proves the holder was given the token
	CAHashSize      = sha256.Size
)

// maxTokenLen bounds what ParseToken looks at: a real token is about 80
// characters.
const maxTokenLen = 256

// Token is a parsed join token.
type Token struct {
	// ID names the token; it is stored in clear on the Edge.
	ID string
	// Secret is the part only the token's holder knows; the Edge stores
	// its SHA-256.
	Secret []byte
	// CAHash is the SHA-256 of the Edge CA's SubjectPublicKeyInfo.
	CAHash []byte
}

// ErrMalformedToken is the error of every token ParseToken refuses.
var ErrMalformedToken = errors.New("malformed join token")

var b64 = base64.RawURLEncoding

// b64Alphabet is base64url's alphabet (RFC 4648 §5).
const b64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// String encodes the token as iop1.ID.SECRET.CAHASH, each part base64url
// without padding.
func (t Token) String() string {
	return TokenPrefix + "." + t.ID + "." + b64.EncodeToString(t.Secret) + "." + b64.EncodeToString(t.CAHash)
}

// CAHashString is the CA hash as printed for operators (sha256:HEX), the
// form `kubeadm join --discovery-token-ca-cert-hash` uses.
func (t Token) CAHashString() string { return FormatCAHash(t.CAHash) }

// ParseToken parses a token made by Token.String. It is strict: exactly four
// parts, the known version, canonical base64url and exact sizes, so that one
// token has one spelling.
func ParseToken(s string) (Token, error) {
	bad := func(format string, args ...any) (Token, error) {
		return Token{}, fmt.Errorf("%w: %s", ErrMalformedToken, fmt.Sprintf(format, args...))
	}
	s = strings.TrimSpace(s)
	if len(s) > maxTokenLen {
		return bad("%d characters, a token has about 80", len(s))
	}
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return bad("want %s.ID.SECRET.CAHASH (4 parts separated by '.'), got %d parts", TokenPrefix, len(parts))
	}
	if parts[0] != TokenPrefix {
		return bad("unsupported token version %q (this noded reads %s)", parts[0], TokenPrefix)
	}
	if _, err := decodePart(parts[1], TokenIDSize); err != nil {
		return bad("id: %v", err)
	}
	secret, err := decodePart(parts[2], TokenSecretSize)
	if err != nil {
		return bad("secret: %v", err)
	}
	hash, err := decodePart(parts[3], CAHashSize)
	if err != nil {
		return bad("CA hash: %v", err)
	}
	return Token{ID: parts[1], Secret: secret, CAHash: hash}, nil
}

// decodePart decodes one base64url part of exactly size bytes, refusing
// non-canonical encodings (stray trailing bits).
func decodePart(s string, size int) ([]byte, error) {
	if b64.EncodedLen(size) != len(s) {
		return nil, fmt.Errorf("want %d base64url characters, got %d", b64.EncodedLen(size), len(s))
	}
	// encoding/base64 skips '\r' and '\n' even when strict: refuse
	// anything outside the alphabet first, so one token has one spelling.
	if strings.TrimLeft(s, b64Alphabet) != "" {
		return nil, errors.New("not base64url")
	}
	b, err := b64.Strict().DecodeString(s)
	if err != nil || len(b) != size {
		return nil, errors.New("not base64url")
	}
	return b, nil
}

// ValidTokenID reports whether id is how Token.String spells a token id.
func ValidTokenID(id string) bool {
	_, err := decodePart(id, TokenIDSize)
	return err == nil
}

// CAHash returns the SHA-256 of the CA certificate's SubjectPublicKeyInfo:
// what a token carries so a Node can recognise its Edge's CA before it has
// any certificate. It survives re-issuing the CA certificate with the same
// key, as kubeadm's discovery hash does.
func CAHash(ca *x509.Certificate) []byte {
	h := sha256.Sum256(ca.RawSubjectPublicKeyInfo)
	return h[:]
}

// FormatCAHash prints a CA hash as sha256:HEX.
func FormatCAHash(h []byte) string { return fmt.Sprintf("sha256:%x", h) }

// SecretHash is what the Edge stores of a token's secret.
func SecretHash(secret []byte) []byte {
	h := sha256.Sum256(secret)
	return h[:]
}

// SecretMatches reports, in constant time, whether secret hashes to stored.
func SecretMatches(secret, stored []byte) bool {
	return len(stored) == sha256.Size && subtle.ConstantTimeCompare(SecretHash(secret), stored) == 1
}

// MatchesCA reports whether ca is the CA a token names.
func (t Token) MatchesCA(ca *x509.Certificate) bool {
	return bytes.Equal(CAHash(ca), t.CAHash)
}
