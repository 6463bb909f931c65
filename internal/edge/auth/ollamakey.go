package auth

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
)

// Ollama key signatures. The ollama CLI, and Ollama's Go client it is built on, send no API key;
// with OLLAMA_AUTH=1 they sign every request with the user's ~/.ollama/id_ed25519 instead:
//
//	challenge:     METHOD,PATH?ts=UNIX          ("POST,/api/pull?ts=1767225600")
//	query:         ts=UNIX added to the request's own query
//	Authorization: BASE64(public key blob):BASE64(signature blob)   (no scheme)
//
// PATH is the API path the client asked for ("/api/pull"), without the query; UNIX is the
// client's clock in whole seconds. The body is not signed. Ollama's own server checks none of
// this (only ollama.com does); the Edge checks it as the client makes it: a key listed in a
// principal's ollama_keys, the signature over exactly that challenge with the request's method,
// path and ts, ts within SignatureWindow of the Edge's clock, and the signature not replayed.
//
// Replays. Ed25519 signatures are deterministic and ts has a resolution of one second, so two
// requests a client signs for the same method and path within one second carry the same
// header: `ollama rm a b` deletes twice within milliseconds, and a program making concurrent
// calls does the same. Refusing every second use would refuse those. So a signature is good
// for signatureReuse after its first use at the Edge, from the address that used it first, and
// refused from anywhere else, or later, until its ts leaves the window (when the timestamp
// check refuses it for good). Someone who copies a signature off the wire can then use it only
// within that moment, from the same address, and only for the same method and path; over an
// untrusted network use TLS (api.tls), which keeps it off the wire.

// Errors a signed request is refused with; each is answered 401 in the API's shape. Which part
// of a bad signature failed (an unknown key, a signature that does not match) is logged, not
// told: the client is told what it can act on.
var (
	// ErrBadSignature is a signature by a key no principal lists, or one that does not match
	// the request's method, path and ts.
	ErrBadSignature = errors.New("invalid Ollama key signature: the key is not listed in a principal's ollama_keys on this Edge, " +
		"or the signature does not match the request")
	// ErrMalformedSignature is an Authorization header in Ollama's form that does not decode, or
	// a signed request without exactly one ts query parameter.
	ErrMalformedSignature = errors.New("malformed Ollama key signature: Authorization must be BASE64(public key):BASE64(signature) " +
		"and the query must carry the signed ts, as the ollama CLI sends them with OLLAMA_AUTH=1")
	// ErrStaleSignature is a valid signature whose ts is more than SignatureWindow away from the
	// Edge's clock.
	ErrStaleSignature = fmt.Errorf("the Ollama key signature's timestamp (ts) is more than %v away from this Edge's clock: "+
		"check the client's clock", SignatureWindow)
	// ErrReplayedSignature is a valid signature used again later than signatureReuse after its
	// first use, or from another address.
	ErrReplayedSignature = errors.New("the Ollama key signature was used already: each request must be signed anew")
	// ErrTooManySignatures is a key that signed more than maxSignaturesPerKey different
	// requests within the window; no client does, so it is refused rather than remembered.
	ErrTooManySignatures = fmt.Errorf("too many signed requests by this Ollama key in %v", SignatureWindow)
)

const (
	// SignatureWindow is how far a signed request's ts may be from the Edge's clock, either way.
	// It covers clocks that are not synchronised to the second (machines without NTP drift
	// seconds a day; five minutes is Kerberos's allowance), and bounds how long the Edge keeps
	// each signature to refuse its replay. A replay is refused by the memory, not by the window.
	SignatureWindow = 5 * time.Minute
	// signatureReuse is how long after its first use a signature is accepted again from the
	// same address: the same-second requests of one client carry the same signature (see
	// above), sent within the second they were signed in, so they arrive within about a second
	// of one another.
	signatureReuse = 2 * time.Second
	// maxSignaturesPerKey bounds the signatures remembered per key: a client signs one per
	// method, path and second, so a busy one (a few paths every second for the whole window)
	// stays far below it. At most 4096 × ~100 bytes per configured key.
	maxSignaturesPerKey = 4096
)

// RefusedSignature is the kind (iop_edge_refusals_total) of a refused Ollama key signature.
const RefusedSignature = "ollama_signature"

// Option configures an Authenticator.
type Option func(*signatures)

// WithRefusals reports every refused Ollama key signature to refuse (frontdoor.Refusals.Refuse),
// with the reason the client is not told: which key (its fingerprint and comment), whether it
// is unknown or its signature does not match, the clock difference.
func WithRefusals(refuse func(kind, msg string, args ...any)) Option {
	return func(s *signatures) { s.refuse = refuse }
}

// ollamaKey is one entry of a principal's ollama_keys.
type ollamaKey struct {
	pub         ssh.PublicKey
	comment     string // the key line's comment (user@host), for logs
	fingerprint string // SHA256:..., as ssh-keygen -l prints it
	principal   Principal
}

// buildOllamaKeys returns the keys of cfg's principals by their wire form, refusing what
// edgeconfig.Validate refuses (a line ParseOllamaKey does not accept, a key listed twice).
func buildOllamaKeys(cfg *edgeconfig.Config, principals map[string]Principal) (map[string]*ollamaKey, error) {
	keys := make(map[string]*ollamaKey)
	for i, p := range cfg.Principals {
		for j, line := range p.OllamaKeys {
			pub, comment, err := edgeconfig.ParseOllamaKey(line)
			if err != nil {
				return nil, fmt.Errorf("auth: principals[%d].ollama_keys[%d]: %w", i, j, err)
			}
			wire := string(pub.Marshal())
			if keys[wire] != nil {
				return nil, fmt.Errorf("auth: principals[%d].ollama_keys[%d]: the same key is listed twice", i, j)
			}
			keys[wire] = &ollamaKey{pub: pub, comment: comment, fingerprint: ssh.FingerprintSHA256(pub), principal: principals[p.Name]}
		}
	}
	return keys, nil
}

// signatureOf returns the Authorization value of h in Ollama's form (no scheme: two base64
// blobs joined by a colon), "" when there is none, or ErrMalformedSignature when h carries two
// different ones.
func signatureOf(h http.Header) (string, error) {
	var sig string
	for _, v := range h.Values("Authorization") {
		v = strings.TrimSpace(v)
		if v == "" || strings.ContainsAny(v, " \t") || !strings.Contains(v, ":") {
			continue // a scheme and its credentials (Bearer, Basic), or nothing
		}
		if sig != "" && sig != v {
			return "", ErrMalformedSignature
		}
		sig = v
	}
	return sig, nil
}

// verdictKey is the context key of a request's verdict (see Boundary): its signature is
// checked once, however many times the request is authenticated, so that it is logged and
// counted once.
type verdictKey struct{ s *signatures }

// verdict is the outcome of a request's signature, once checked. A request's handlers run one
// after another, so it needs no lock.
type verdict struct {
	done bool
	p    Principal
	err  error
}

// signed authenticates r, which carries the Ollama key signature sig, under st.
func (st *state) signed(r *http.Request, sig string) (Principal, error) {
	v, _ := r.Context().Value(verdictKey{st.sigs}).(*verdict)
	if v != nil && v.done {
		return v.p, v.err
	}
	p, err := st.verify(r, sig)
	if v != nil {
		*v = verdict{done: true, p: p, err: err}
	}
	return p, err
}

// verify checks sig, r's Ollama key signature, and returns the principal of its key. A refusal
// is reported with its details.
func (st *state) verify(r *http.Request, sig string) (Principal, error) {
	refuse := func(err error, reason string, k *ollamaKey, args ...any) (Principal, error) {
		args = append(args, "reason", reason, "method", r.Method, "path", clip(r.URL.Path), "remote", r.RemoteAddr)
		if k != nil {
			args = append(args, "principal", k.principal.Name, "key", k.fingerprint, "comment", clip(k.comment))
		}
		st.sigs.refuse(RefusedSignature, "Ollama key signature refused", args...)
		return Principal{}, err
	}
	if len(sig) > maxKeyLen {
		return refuse(ErrMalformedSignature, "oversized header", nil)
	}
	pubText, sigText, _ := strings.Cut(sig, ":")
	pubBlob, err1 := base64.StdEncoding.DecodeString(pubText)
	sigBlob, err2 := base64.StdEncoding.DecodeString(sigText)
	ts := r.URL.Query()["ts"]
	if err1 != nil || err2 != nil || len(ts) != 1 {
		return refuse(ErrMalformedSignature, "malformed header or ts", nil, "ts_values", len(ts))
	}
	k := st.ollamaKeys[string(pubBlob)]
	if k == nil {
		reason := "unknown key"
		if pub, err := ssh.ParsePublicKey(pubBlob); err == nil {
			reason += " " + ssh.FingerprintSHA256(pub) // so that the operator can tell whose it is
		}
		return refuse(ErrBadSignature, reason, nil)
	}
	challenge := r.Method + "," + r.URL.Path + "?ts=" + ts[0]
	if err := k.pub.Verify([]byte(challenge), &ssh.Signature{Format: k.pub.Type(), Blob: sigBlob}); err != nil {
		return refuse(ErrBadSignature, "signature does not match", k, "challenge", clip(challenge))
	}
	unix, err := strconv.ParseInt(ts[0], 10, 64)
	if err != nil {
		return refuse(ErrMalformedSignature, "ts is not a number", k)
	}
	signedAt := time.Unix(unix, 0)
	if skew := time.Since(signedAt); skew > SignatureWindow || skew < -SignatureWindow {
		return refuse(ErrStaleSignature, "timestamp outside the window", k, "clock_difference", skew.Round(time.Second).String())
	}
	if err := st.sigs.use(string(pubBlob), sigBlob, signedAt, hostOf(r.RemoteAddr)); err != nil {
		return refuse(err, err.Error(), k)
	}
	return k.principal, nil
}

// hostOf is the address of remoteAddr (host:port), or remoteAddr itself when it is not one.
func hostOf(remoteAddr string) string {
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		return ap.Addr().Unmap().WithZone("").String()
	}
	return remoteAddr
}

// signatures remembers the signatures that were used, per key, until their ts leaves the
// window, to refuse their replay (see the comment at the top of this file). It outlives the
// configuration: a reload does not open the window again. Safe for concurrent use.
type signatures struct {
	refuse func(kind, msg string, args ...any)

	mu    sync.Mutex
	used  map[string]map[[sha256.Size]byte]use // by key (wire form), by signature's SHA-256
	swept time.Time                            // when every key's expired uses were last dropped
}

// use is one remembered signature.
type use struct {
	first   time.Time // its first use at the Edge
	from    string    // the address that used it first
	expires time.Time // its ts plus SignatureWindow: from then on the timestamp check refuses it
}

func newSignatures(opts []Option) *signatures {
	s := &signatures{refuse: func(string, string, ...any) {}, used: map[string]map[[sha256.Size]byte]use{}}
	for _, o := range opts {
		o(s)
	}
	return s
}

// use records that sig, by key, signed at signedAt, is used now from the address from, or
// returns ErrReplayedSignature when it was used before (other than from the same address
// within signatureReuse), or ErrTooManySignatures.
func (s *signatures) use(key string, sig []byte, signedAt time.Time, from string) error {
	now := time.Now()
	id := sha256.Sum256(sig)
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.swept) > SignatureWindow {
		for k, uses := range s.used {
			if sweep(uses, now); len(uses) == 0 {
				delete(s.used, k)
			}
		}
		s.swept = now
	}
	uses := s.used[key]
	if uses == nil {
		uses = make(map[[sha256.Size]byte]use)
		s.used[key] = uses
	}
	if u, ok := uses[id]; ok {
		if u.from == from && now.Sub(u.first) <= signatureReuse {
			return nil
		}
		return ErrReplayedSignature
	}
	if len(uses) >= maxSignaturesPerKey {
		if sweep(uses, now); len(uses) >= maxSignaturesPerKey {
			return ErrTooManySignatures
		}
	}
	uses[id] = use{first: now, from: from, expires: signedAt.Add(SignatureWindow)}
	return nil
}

// sweep drops the uses whose ts has left the window by now.
func sweep(uses map[[sha256.Size]byte]use, now time.Time) {
	for id, u := range uses {
		if now.After(u.expires) {
			delete(uses, id)
		}
	}
}
