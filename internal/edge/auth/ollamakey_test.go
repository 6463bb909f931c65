package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
)

// ollamaSigner signs requests as Ollama's Go client does with OLLAMA_AUTH=1 (api/client.go and
// auth/auth.go of github.com/ollama/ollama v0.17.4): the challenge "METHOD,PATH?ts=UNIX" signed
// with the Ed25519 key, ts added to the query, and Authorization: BASE64(public key
// blob):BASE64(signature blob).
type ollamaSigner struct {
	signer ssh.Signer
	line   string // the authorized_keys line of the public key, as ollama_keys lists it
}

func newOllamaSigner(t testing.TB, comment string) ollamaSigner {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))) + " " + comment
	return ollamaSigner{signer: s, line: line}
}

// header is the Authorization value of the signature of challenge.
func (o ollamaSigner) header(t testing.TB, challenge string) string {
	t.Helper()
	sig, err := o.signer.Sign(rand.Reader, []byte(challenge))
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(o.signer.PublicKey().Marshal()) + ":" + base64.StdEncoding.EncodeToString(sig.Blob)
}

// request is method path signed at ts, from the client's address remote.
func (o ollamaSigner) request(t testing.TB, method, path string, ts time.Time, remote string) *http.Request {
	t.Helper()
	unix := strconv.FormatInt(ts.Unix(), 10)
	r := httptest.NewRequest(method, path+"?ts="+unix, nil)
	r.Header.Set("Authorization", o.header(t, method+","+path+"?ts="+unix))
	r.RemoteAddr = remote
	return r
}

// signedConfig is keyedConfig (alice an admin, bob not) with alice's and bob's Ollama keys,
// without anonymous access.
func signedConfig(alice, bob ollamaSigner) *edgeconfig.Config {
	c := keyedConfig(false)
	c.Principals[0].Admin = true
	c.Principals[0].OllamaKeys = []string{alice.line}
	c.Principals[1].OllamaKeys = []string{bob.line}
	return c
}

const client = "192.0.2.10:50000"

// A request signed as the ollama CLI signs it acts as the principal listing the key, with its
// routes and admin flag; one whose signature is not over exactly its method, path and ts, by a
// key nobody lists, too old or too new, or malformed, is refused (issue 23: the ollama CLI
// manages the fleet through the Edge).
func TestOllamaSignatureIdentifiesItsPrincipal(t *testing.T) {
	alice, bob, mallory := newOllamaSigner(t, "alice@laptop"), newOllamaSigner(t, "bob@desk"), newOllamaSigner(t, "mallory@x")
	now := time.Now()
	unix := strconv.FormatInt(now.Unix(), 10)
	signedWith := func(o ollamaSigner, challenge, method, target string) *http.Request {
		r := httptest.NewRequest(method, target, nil)
		r.Header.Set("Authorization", o.header(t, challenge))
		return r
	}
	signedAs := func(o ollamaSigner, challenge, target string) *http.Request {
		method, _, _ := strings.Cut(challenge, ",")
		return signedWith(o, challenge, method, target)
	}
	withPub := func(r *http.Request, of ollamaSigner) *http.Request {
		_, sig, _ := strings.Cut(r.Header.Get("Authorization"), ":")
		r.Header.Set("Authorization", base64.StdEncoding.EncodeToString(of.signer.PublicKey().Marshal())+":"+sig)
		return r
	}
	tests := []struct {
		name string
		r    *http.Request
		want string // the principal, "" when refused
		err  error
	}{
		{"alice pulls", alice.request(t, "POST", "/api/pull", now, client), "alice", nil},
		{"bob lists", bob.request(t, "GET", "/api/tags", now, client), "bob", nil},
		{"HEAD of the root", alice.request(t, "HEAD", "/", now, client), "alice", nil},
		{"a clock 4m59s behind", alice.request(t, "POST", "/api/chat", now.Add(-SignatureWindow+time.Second), client), "alice", nil},
		{"a clock 4m59s ahead", alice.request(t, "POST", "/api/chat", now.Add(SignatureWindow-time.Second), client), "alice", nil},
		{"a key nobody lists", mallory.request(t, "POST", "/api/pull", now, client), "", ErrBadSignature},
		{"bob's signature under alice's key", withPub(bob.request(t, "POST", "/api/pull", now, client), alice), "", ErrBadSignature},
		{"a signature of another path", signedAs(alice, "POST,/api/tags?ts="+unix, "/api/pull?ts="+unix), "", ErrBadSignature},
		{"a signature of another method", signedWith(alice, "GET,/api/delete?ts="+unix, "DELETE", "/api/delete?ts="+unix), "", ErrBadSignature},
		{"a signature of another ts", signedAs(alice, "POST,/api/pull?ts="+unix, "/api/pull?ts="+strconv.FormatInt(now.Unix()+1, 10)), "", ErrBadSignature},
		{"a clock 6 minutes behind", alice.request(t, "POST", "/api/pull", now.Add(-6*time.Minute), client), "", ErrStaleSignature},
		{"a clock 6 minutes ahead", alice.request(t, "POST", "/api/pull", now.Add(6*time.Minute), client), "", ErrStaleSignature},
		{"no ts", signedAs(alice, "POST,/api/pull?ts="+unix, "/api/pull"), "", ErrMalformedSignature},
		{"two ts", signedAs(alice, "POST,/api/pull?ts="+unix, "/api/pull?ts="+unix+"&ts="+unix), "", ErrMalformedSignature},
		{"a ts that is not a number", signedAs(alice, "POST,/api/pull?ts=soon", "/api/pull?ts=soon"), "", ErrMalformedSignature},
		{"not base64", signedAs(alice, "POST,/api/pull?ts="+unix, "/api/pull?ts="+unix), "", ErrMalformedSignature},
		{"oversized", signedAs(alice, "POST,/api/pull?ts="+unix, "/api/pull?ts="+unix), "", ErrMalformedSignature},
		{"a signature and an API key", signedAs(alice, "POST,/api/pull?ts="+unix, "/api/pull?ts="+unix), "", ErrInvalidKey},
		{"two different signatures", signedAs(alice, "POST,/api/pull?ts="+unix, "/api/pull?ts="+unix), "", ErrMalformedSignature},
	}
	byName := func(name string) *http.Request {
		for _, tt := range tests {
			if tt.name == name {
				return tt.r
			}
		}
		panic(name)
	}
	byName("not base64").Header.Set("Authorization", "not-base64!:AAAA")
	byName("oversized").Header.Set("Authorization", strings.Repeat("A", maxKeyLen)+":AAAA")
	byName("a signature and an API key").Header.Set("X-Api-Key", aliceKey)
	byName("two different signatures").Header.Add("Authorization", bob.header(t, "POST,/api/pull?ts="+unix))

	rec := &recorded{}
	a, err := New(signedConfig(alice, bob), WithRefusals(rec.refuse))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := a.Authenticate(tt.r)
			if p.Name != tt.want || !errors.Is(err, tt.err) {
				t.Fatalf("Authenticate = %q, %v; want %q, %v", p.Name, err, tt.want, tt.err)
			}
			if tt.want == "alice" && !p.Admin || tt.want == "bob" && (p.Admin || !p.MayUse("llama") || p.MayUse("other")) {
				t.Errorf("principal %+v: want alice an admin with every route, bob llama only", p)
			}
		})
	}
	// The key's owner is in the log, never in the answer.
	for _, err := range []error{ErrBadSignature, ErrMalformedSignature, ErrStaleSignature, ErrReplayedSignature} {
		if strings.Contains(err.Error(), "alice") || strings.Contains(err.Error(), "SHA256:") {
			t.Errorf("%q names a key", err)
		}
	}
	if got := rec.count(RefusedSignature); got != 12 {
		t.Errorf("%d signatures reported refused, want 12 (each refusal but those of two credentials)", got)
	}
}

// The ollama CLI signs two deletes in one second with the same header (Ed25519 is
// deterministic, ts whole seconds), so the same signature is good again from the same address
// for signatureReuse after its first use; later, or from another address, it is a replay.
func TestOllamaSignatureReplayIsRefused(t *testing.T) {
	alice, bob := newOllamaSigner(t, "alice@laptop"), newOllamaSigner(t, "bob@desk")
	synctest.Test(t, func(t *testing.T) {
		a := mustNew(t, signedConfig(alice, bob))
		signedAt := time.Now()
		again := func(remote string) error {
			_, err := a.Authenticate(alice.request(t, "DELETE", "/api/delete", signedAt, remote))
			return err
		}
		if err := again(client); err != nil {
			t.Fatalf("first use: %v", err)
		}
		time.Sleep(time.Second)
		if err := again(client); err != nil {
			t.Fatalf("the same signature a second later from the same address (ollama rm a b): %v", err)
		}
		if err := again("198.51.100.7:40000"); !errors.Is(err, ErrReplayedSignature) {
			t.Fatalf("the same signature from another address: %v, want %v", err, ErrReplayedSignature)
		}
		time.Sleep(signatureReuse)
		if err := again(client); !errors.Is(err, ErrReplayedSignature) {
			t.Fatalf("the same signature %v after its first use: %v, want %v", time.Since(signedAt), err, ErrReplayedSignature)
		}
		// A reload does not forget it.
		if err := a.Replace(signedConfig(alice, bob)); err != nil {
			t.Fatal(err)
		}
		if err := again(client); !errors.Is(err, ErrReplayedSignature) {
			t.Fatalf("after a reload: %v, want %v", err, ErrReplayedSignature)
		}
		// The next request is signed anew, and served.
		if _, err := a.Authenticate(alice.request(t, "DELETE", "/api/delete", time.Now(), client)); err != nil {
			t.Fatalf("a new signature: %v", err)
		}
		// Once its ts has left the window, the timestamp refuses it, and it is forgotten.
		time.Sleep(SignatureWindow)
		if err := again(client); !errors.Is(err, ErrStaleSignature) {
			t.Fatalf("after the window: %v, want %v", err, ErrStaleSignature)
		}
	})
}

// The signatures remembered are bounded: per key, and dropped once their ts leaves the window.
func TestOllamaSignatureMemoryIsBounded(t *testing.T) {
	alice, bob := newOllamaSigner(t, "alice@laptop"), newOllamaSigner(t, "bob@desk")
	synctest.Test(t, func(t *testing.T) {
		a := mustNew(t, signedConfig(alice, bob))
		for i := range maxSignaturesPerKey {
			if _, err := a.Authenticate(alice.request(t, "POST", fmt.Sprintf("/api/x%d", i), time.Now(), client)); err != nil {
				t.Fatalf("signature %d: %v", i, err)
			}
		}
		if _, err := a.Authenticate(alice.request(t, "POST", "/api/one-more", time.Now(), client)); !errors.Is(err, ErrTooManySignatures) {
			t.Fatalf("signature %d: %v, want %v", maxSignaturesPerKey+1, err, ErrTooManySignatures)
		}
		if _, err := a.Authenticate(bob.request(t, "POST", "/api/chat", time.Now(), client)); err != nil {
			t.Fatalf("another key: %v", err)
		}
		time.Sleep(SignatureWindow + time.Second)
		if _, err := a.Authenticate(alice.request(t, "POST", "/api/one-more", time.Now(), client)); err != nil {
			t.Fatalf("after the window: %v", err)
		}
		a.sigs.mu.Lock()
		n := len(a.sigs.used)
		for _, uses := range a.sigs.used {
			n += len(uses)
		}
		a.sigs.mu.Unlock()
		if n != 2 { // alice's key and its one new signature
			t.Errorf("%d keys and signatures remembered after the window, want 2", n)
		}
	})
}

// Behind Boundary a request's signature is checked, and a refusal reported, once however often
// its handlers authenticate it; a signed request is not a keyless one (Boundary's checks of
// Host, origin and body type are for those).
func TestBoundaryChecksASignatureOnce(t *testing.T) {
	alice, bob, mallory := newOllamaSigner(t, "alice@laptop"), newOllamaSigner(t, "bob@desk"), newOllamaSigner(t, "mallory@x")
	c := signedConfig(alice, bob)
	c.API.TrustedNetworks = []edgeconfig.TrustedNetwork{{CIDR: "192.0.2.0/24", Principal: "bob"}}
	rec := &recorded{}
	a, err := New(c, WithRefusals(rec.refuse))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	h := a.Boundary(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for range 3 {
			p, err := a.Authenticate(r)
			got = append(got, fmt.Sprintf("%s %v", p.Name, err != nil))
		}
	}), BoundaryOptions{})
	serve := func(r *http.Request) {
		r.Host = "evil.example" // would be refused without a valid credential
		r.Header.Set("Content-Type", "text/plain")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	serve(alice.request(t, "POST", "/api/pull", time.Now(), client))
	serve(mallory.request(t, "POST", "/api/pull", time.Now(), client))
	want := []string{"alice false", "alice false", "alice false", " true", " true", " true"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("handlers authenticated %q, want %q", got, want)
	}
	if n := rec.count(RefusedSignature); n != 1 {
		t.Errorf("mallory's signature reported %d times, want once", n)
	}
}

// With no ollama_keys anywhere, a signature is no credential: OLLAMA_AUTH=1 set for another
// server leaves its user anonymous on a loopback Edge, as a placeholder API key does.
func TestOllamaSignatureIgnoredWhenNoPrincipalListsKeys(t *testing.T) {
	alice := newOllamaSigner(t, "alice@laptop")
	a := mustNew(t, edgeconfig.Default())
	p, err := a.Authenticate(alice.request(t, "POST", "/api/chat", time.Now(), client))
	if err != nil || p.Name != edgeconfig.AnonymousPrincipal {
		t.Errorf("Authenticate = %q, %v; want %q", p.Name, err, edgeconfig.AnonymousPrincipal)
	}
}

func TestNewRefusesABadOllamaKey(t *testing.T) {
	alice, bob := newOllamaSigner(t, "alice@laptop"), newOllamaSigner(t, "bob@desk")
	for name, keys := range map[string][]string{
		"not a key":  {"ssh-ed25519 nope"},
		"twice":      {alice.line, alice.line},
		"an RSA key": {"ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQC7 x"},
	} {
		c := signedConfig(alice, bob)
		c.Principals[1].OllamaKeys = keys
		if _, err := New(c); err == nil || !strings.Contains(err.Error(), "principals[1].ollama_keys[") {
			t.Errorf("%s: New = %v, want an error naming principals[1].ollama_keys", name, err)
		}
	}
}

// recorded counts refusals by kind (browser_test.go's recorded records their kinds).
func (r *recorded) count(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, k := range r.kinds {
		if k == kind {
			n++
		}
	}
	return n
}
