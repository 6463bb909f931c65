package credentials

import (
	"errors"
	"fmt"
	"io/fs"
)

// Reasons of an *Error: why the Store refused.
const (
	ReasonProfileDisabled    = "profile_disabled"
	ReasonCredentialDisabled = "credential_disabled"
	ReasonCredentialRevoked  = "credential_revoked"
	ReasonUnknown            = "unknown"
	ReasonNoCredential       = "no_credential"
)

// Sentinels an *Error matches with errors.Is, one per reason.
var (
	// ErrProfileDisabled: the profile was disabled by an operator; no lease is issued for it.
	ErrProfileDisabled = errors.New("profile disabled")
	// ErrCredentialDisabled: the credential was disabled by an operator; no lease is issued
	// for it, whichever profile asks.
	ErrCredentialDisabled = errors.New("credential disabled")
	// ErrCredentialRevoked: the credential was revoked and has not been reloaded since.
	ErrCredentialRevoked = errors.New("credential revoked")
	// ErrUnknown: no credential or profile has that name.
	ErrUnknown = errors.New("unknown credential or profile")
	// ErrNoCredential: the profile uses no credential, so there is no lease of it to disable.
	ErrNoCredential = errors.New("profile uses no credential")
)

// Error is a refusal of the Store. errors.Is matches it with the sentinel of its Reason. It
// names the credential or profile, never a value.
type Error struct {
	Reason  string // one of the Reason constants
	Subject string // "credential" or "profile": what Name names
	Name    string
	// Revision is the credential's current revision, for ReasonCredentialRevoked.
	Revision uint64
	// Known lists the names that do exist, for ReasonUnknown.
	Known []string
}

func (e *Error) Error() string {
	switch e.Reason {
	case ReasonProfileDisabled:
		return fmt.Sprintf("profile %q is disabled: no credential lease is issued for it until it is enabled", e.Name)
	case ReasonCredentialDisabled:
		return fmt.Sprintf("credential %q is disabled: no lease of it is issued until it is enabled", e.Name)
	case ReasonCredentialRevoked:
		return fmt.Sprintf("credential %q is revoked (revision %d): reload it with a new secret", e.Name, e.Revision)
	case ReasonNoCredential:
		return fmt.Sprintf("profile %q uses no credential, so it has no lease to disable", e.Name)
	case ReasonUnknown:
		if len(e.Known) == 0 {
			return fmt.Sprintf("no %s named %q; none is configured", e.Subject, e.Name)
		}
		return fmt.Sprintf("no %s named %q; configured: %s", e.Subject, e.Name, joinNames(e.Known))
	}
	return fmt.Sprintf("%s %q: %s", e.Subject, e.Name, e.Reason)
}

// Is reports whether target is the sentinel of e's reason.
func (e *Error) Is(target error) bool {
	return target != nil && sentinel(e.Reason) == target
}

func sentinel(reason string) error {
	switch reason {
	case ReasonProfileDisabled:
		return ErrProfileDisabled
	case ReasonCredentialDisabled:
		return ErrCredentialDisabled
	case ReasonCredentialRevoked:
		return ErrCredentialRevoked
	case ReasonUnknown:
		return ErrUnknown
	case ReasonNoCredential:
		return ErrNoCredential
	}
	return nil
}

// SourceError is a credential whose value could not be read from its source: a missing or
// empty environment variable, an unreadable file, or a value no provider could be sent. It
// names the credential and the source, never the value.
type SourceError struct {
	Credential string
	Source     string // "env:NAME" or "file:PATH"
	Err        error
}

func (e *SourceError) Error() string {
	return fmt.Sprintf("credential %q from %s: %v", e.Credential, e.Source, e.Err)
}

func (e *SourceError) Unwrap() error { return e.Err }

// sourceError wraps err for the credential name read from source. A *fs.PathError of the
// source's own path is reduced to its operation and cause, since the source already names the
// path.
func sourceError(name, source, path string, err error) *SourceError {
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path == path {
		err = fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return &SourceError{Credential: name, Source: source, Err: err}
}
