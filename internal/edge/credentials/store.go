// Package credentials is the Edge's credential store: the secrets that model servers behind some
// profiles need (the key of a hosted OpenAI-compatible API), read from the environment variables
// and files the config names, with the state operators change at run time: revoke, reload,
// disable and enable (SPEC R11, S4; ARCHITECTURE.md decision 9).
//
// The gateway asks Grant for the credential of a request's profile on every dispatch and seals
// what it gets into a lease for one Node (see quicwire/lease). The transport sends Notice to
// every Node whenever Changed fires, so that a Node refuses leases that the Edge would no longer
// issue: those below a credential's current revision, and those of a disabled profile or
// credential.
//
// # Revisions
//
// Each credential has a revision, starting at 1. Revoke raises it by one and stops every lease
// of the credential until Reload reads the value again, keeping the raised revision; a Node that
// has the new revision refuses every lease below it. Reload without a prior Revoke raises the
// revision too: the value may have changed, and leases of the old one must die.
//
// # Secrets
//
// Values are held as []byte, copied out by Grant for the caller to wipe, and wiped here when
// replaced or revoked. No error, view, String or log value of this package holds one: they name
// the credential and its source ("env:OPENAI_API_KEY", "file:/run/secrets/openai") instead.
package credentials

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/yamlconf"
	"github.com/iop-dev/iop/quicwire/lease"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Store holds every configured credential's value and the run-time state of credentials and
// profiles. It is safe for concurrent use.
type Store struct {
	getenv   func(string) string
	readFile func(string) ([]byte, error)

	// admin serialises the operations that change state (Revoke, Reload, Disable..., Enable...),
	// so that a Reload, which reads its source without holding mu, cannot install a value read
	// before a Revoke that completed while it was reading.
	admin sync.Mutex

	// mu guards the layout (replaced whole by Apply, which also holds admin), the fields of its
	// entries that change (see credential and profile), retired and changed.
	mu sync.RWMutex
	layout
	// retired is the last revision of each credential a reload removed, so that one added back
	// under the same name starts above it: Nodes refuse leases below the highest revision they
	// have seen.
	retired map[string]uint64
	changed chan struct{}
}

// layout is what the configuration says: the credentials and profiles by name.
type layout struct {
	creds       map[string]*credential
	credNames   []string // sorted
	profiles    map[string]*profile
	profNames   []string // sorted
	credsInFile []string // credential names in config order, for messages
}

// credential is one configured credential and its state.
type credential struct {
	cfg      edgeconfig.Credential // immutable
	profiles []string              // immutable: the sorted names of the profiles that use it

	// Guarded by Store.mu.
	secret   []byte // nil while revoked
	revision uint64
	revoked  bool
	disabled bool
}

// profile is one profile and its state.
type profile struct {
	credential string // immutable; "" when the profile uses none
	disabled   bool   // guarded by Store.mu
}

// Options configure a Store.
type Options struct {
	// Getenv and ReadFile read the credentials' sources; nil is os.Getenv
	// and os.ReadFile.
	Getenv   func(string) string
	ReadFile func(string) ([]byte, error)
}

// New loads the secret of every configured credential from its source
// (opts say how to read them). A missing environment variable, an empty
// value, an unreadable file, or a value a lease cannot carry is an error, a *SourceError naming
// the credential and its source (never the value); every such problem is reported, joined.
// Trailing newlines of a file are not part of the value.
//
// New also refuses the credential problems edgeconfig.Validate refuses (a duplicate name, a source
// that is not exactly one of env and file, an unknown kind, a profile naming an unknown
// credential, a profile with a credential in loopback mode), so a config built in code cannot
// slip past them. Every profile of cfg is known to the store, and the profile
// edgeconfig.DefaultProfileName too when cfg does not define it.
func New(cfg *edgeconfig.Config, opts Options) (*Store, error) {
	if cfg == nil {
		return nil, errors.New("credentials: nil config")
	}
	getenv, readFile := opts.Getenv, opts.ReadFile
	if getenv == nil {
		getenv = os.Getenv
	}
	if readFile == nil {
		readFile = os.ReadFile
	}
	l, err := newLayout(cfg)
	if err != nil {
		return nil, err
	}
	s := &Store{getenv: getenv, readFile: readFile, layout: *l, retired: map[string]uint64{}, changed: make(chan struct{})}
	var errs []error
	for _, name := range s.credsInFile {
		c := s.creds[name]
		c.revision = 1
		secret, err := s.read(c.cfg)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c.secret = secret
	}
	if len(errs) > 0 {
		s.wipe()
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// newLayout builds the credentials and profiles of cfg, without their values, refusing what New
// refuses of cfg.
func newLayout(cfg *edgeconfig.Config) (*layout, error) {
	l := &layout{
		creds:    make(map[string]*credential, len(cfg.Credentials)),
		profiles: make(map[string]*profile, len(cfg.Profiles)+1),
	}
	for i, cr := range cfg.Credentials {
		if err := checkCredential(cr); err != nil {
			return nil, fmt.Errorf("credentials: credentials[%d]: %w", i, err)
		}
		if _, dup := l.creds[cr.Name]; dup {
			return nil, fmt.Errorf("credentials: credentials[%d].name: duplicate credential %q", i, cr.Name)
		}
		l.creds[cr.Name] = &credential{cfg: cr}
		l.credNames = append(l.credNames, cr.Name)
		l.credsInFile = append(l.credsInFile, cr.Name)
	}
	for i, p := range cfg.Profiles {
		if _, dup := l.profiles[p.Name]; dup {
			return nil, fmt.Errorf("credentials: profiles[%d].name: duplicate profile %q", i, p.Name)
		}
		if p.Credential != "" {
			c, ok := l.creds[p.Credential]
			switch {
			case cfg.Identity.Mode == yamlconf.ModeLoopback:
				return nil, fmt.Errorf("credentials: profiles[%d].credential: credential leases need identity.mode %s (managed mode): in loopback mode Nodes are not authenticated", i, yamlconf.ModeMTLS)
			case !ok:
				return nil, fmt.Errorf("credentials: profiles[%d].credential: %w", i, l.unknown("credential", p.Credential))
			}
			c.profiles = append(c.profiles, p.Name)
		}
		l.profiles[p.Name] = &profile{credential: p.Credential}
		l.profNames = append(l.profNames, p.Name)
	}
	if _, ok := l.profiles[edgeconfig.DefaultProfileName]; !ok {
		l.profiles[edgeconfig.DefaultProfileName] = &profile{}
		l.profNames = append(l.profNames, edgeconfig.DefaultProfileName)
	}
	slices.Sort(l.credNames)
	slices.Sort(l.profNames)
	for _, c := range l.creds {
		slices.Sort(c.profiles)
	}
	return l, nil
}

// checkCredential is the part of config's validation of one credential that the store relies on.
func checkCredential(cr edgeconfig.Credential) error {
	if err := yamlconf.CheckID("name", cr.Name); err != nil {
		return err
	}
	switch {
	case (cr.Env == "") == (cr.File == ""):
		return fmt.Errorf("credential %q: set exactly one of env and file", cr.Name)
	case cr.Kind != edgeconfig.CredentialKindBearer:
		return fmt.Errorf("credential %q: kind must be %q, got %q", cr.Name, edgeconfig.CredentialKindBearer, cr.Kind)
	}
	return nil
}

// read returns the value of cr from its source, checked (see checkSecret).
func (s *Store) read(cr edgeconfig.Credential) ([]byte, error) {
	var secret []byte
	if cr.Env != "" {
		v := s.getenv(cr.Env)
		if v == "" {
			return nil, &SourceError{Credential: cr.Name, Source: cr.Source(), Err: errors.New("the environment variable is not set or is empty")}
		}
		secret = []byte(v)
	} else {
		data, err := s.readFile(cr.File)
		if err != nil {
			return nil, sourceError(cr.Name, cr.Source(), cr.File, err)
		}
		secret = bytes.TrimRight(data, "\r\n")
		if len(secret) == 0 {
			clear(data)
			return nil, &SourceError{Credential: cr.Name, Source: cr.Source(), Err: errors.New("the file is empty")}
		}
	}
	if err := checkSecret(secret); err != nil {
		clear(secret)
		return nil, &SourceError{Credential: cr.Name, Source: cr.Source(), Err: err}
	}
	return secret, nil
}

// checkSecret refuses a value a lease cannot carry (over lease.MaxSecretSize) or that a bearer
// credential cannot be presented as (whitespace or control characters have no place in one
// HTTP header value, and are most likely a copy-and-paste accident). It never quotes the value.
func checkSecret(secret []byte) error {
	if len(secret) > lease.MaxSecretSize {
		return fmt.Errorf("the value is %d bytes, over the limit of %d a lease carries", len(secret), lease.MaxSecretSize)
	}
	if i := bytes.IndexFunc(secret, func(r rune) bool { return r <= ' ' || r == 0x7f }); i >= 0 {
		return fmt.Errorf("the value has whitespace or a control character at byte %d of %d, which a bearer credential cannot carry", i, len(secret))
	}
	return nil
}

// wipe zeroes every secret; New calls it when it fails after reading some.
func (s *Store) wipe() {
	for _, c := range s.creds {
		clear(c.secret)
		c.secret = nil
	}
}

// unknown is the error of a name that is not a configured credential or profile.
func (l *layout) unknown(subject, name string) *Error {
	known := l.credsInFile
	if subject == "profile" {
		known = l.profNames
	}
	return &Error{Reason: ReasonUnknown, Subject: subject, Name: name, Known: slices.Clone(known)}
}

func joinNames(names []string) string { return strings.Join(names, ", ") }

// Grant is a credential to lease for one dispatch.
type Grant struct {
	Credential string // the credential's name
	Kind       string // how the adapter presents it (edgeconfig.CredentialKindBearer)
	Revision   uint64 // the credential's current revision, for the lease
	// Secret is a copy of the value that the caller owns: wipe it (clear) once it is sealed.
	Secret []byte
}

// String describes g without its secret.
func (g Grant) String() string {
	return fmt.Sprintf("credential %q (%s, revision %d, secret redacted)", g.Credential, g.Kind, g.Revision)
}

// Format prints String for every verb, so that no verb prints the secret.
func (g Grant) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(g.String())) }

// LogValue logs g without its secret.
func (g Grant) LogValue() slog.Value {
	return slog.GroupValue(slog.String("credential", g.Credential), slog.String("kind", g.Kind), slog.Uint64("revision", g.Revision))
}

// Grant returns the credential to lease for a request of profile; ok is false, with a nil
// error, when the profile uses none. It refuses with an *Error when the profile is disabled
// (ErrProfileDisabled), its credential is disabled (ErrCredentialDisabled), or its credential
// is revoked and not yet reloaded (ErrCredentialRevoked), checked in that order; and with
// ErrUnknown for a profile the config does not define. A refusal is final for that request:
// there is no fallback to another credential (SPEC S4).
//
// Grant takes only a read lock and copies the value; it is meant to be called per dispatch.
func (s *Store) Grant(profile string) (g Grant, ok bool, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, known := s.profiles[profile]
	switch {
	case !known:
		return Grant{}, false, s.unknown("profile", profile)
	case p.credential == "":
		return Grant{}, false, nil
	case p.disabled:
		return Grant{}, false, &Error{Reason: ReasonProfileDisabled, Subject: "profile", Name: profile}
	}
	c := s.creds[p.credential]
	switch {
	case c.disabled:
		return Grant{}, false, &Error{Reason: ReasonCredentialDisabled, Subject: "credential", Name: c.cfg.Name}
	case c.revoked:
		return Grant{}, false, &Error{Reason: ReasonCredentialRevoked, Subject: "credential", Name: c.cfg.Name, Revision: c.revision}
	}
	return Grant{Credential: c.cfg.Name, Kind: c.cfg.Kind, Revision: c.revision, Secret: bytes.Clone(c.secret)}, true, nil
}

// Changed returns a channel that is closed at the next change of state: a revoke, a reload,
// or a disable or enable that changed something. Whoever sends Notice to Nodes reads Changed
// before Notice, so that no change after the read is missed.
func (s *Store) Changed() <-chan struct{} {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.changed
}

func (s *Store) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Notice returns the full current state for Nodes (lease.Opener.Apply): every credential's
// current revision, below which a Node refuses leases, and the disabled profiles and
// credentials, sorted.
func (s *Store) Notice() *wirepb.CredentialNotice {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := &wirepb.CredentialNotice{CredentialRevisions: make(map[string]uint64, len(s.creds))}
	for _, name := range s.credNames {
		c := s.creds[name]
		n.CredentialRevisions[name] = c.revision
		if c.disabled {
			n.DisabledCredentials = append(n.DisabledCredentials, name)
		}
	}
	for _, name := range s.profNames {
		if s.profiles[name].disabled {
			n.DisabledProfiles = append(n.DisabledProfiles, name)
		}
	}
	return n
}
