package sdk

import (
	"errors"
	"fmt"
)

// Kind classifies a failure so that the Node and the Edge can act on it
// (retry elsewhere, answer 429, take a target out of selection).
type Kind int

// Failure kinds. The values travel between processes; never renumber.
const (
	KindInternal        Kind = iota + 1 // a bug or an unexpected state in the adapter
	KindInvalidRequest                  // the request cannot be served as asked
	KindUnauthenticated                 // the server refused the credential
	KindRateLimited                     // the server asks to slow down
	KindModelNotFound                   // the target does not exist on the server
	KindUnavailable                     // the server cannot be reached or is down
	KindUpstream                        // the server failed in another way
	KindUnsupported                     // the adapter does not implement this
)

var kindNames = map[Kind]string{
	KindInternal:        "internal",
	KindInvalidRequest:  "invalid_request",
	KindUnauthenticated: "unauthenticated",
	KindRateLimited:     "rate_limited",
	KindModelNotFound:   "model_not_found",
	KindUnavailable:     "unavailable",
	KindUpstream:        "upstream",
	KindUnsupported:     "unsupported",
}

func (k Kind) String() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return fmt.Sprintf("kind_%d", int(k))
}

// Error is the one error type of adapters. It survives the process
// boundary: on the Node, errors.Is(err, sdk.ErrRateLimited) holds for an
// adapter's rate-limit error.
type Error struct {
	Kind    Kind
	Message string
	// UpstreamStatus is the server's HTTP status, when there was one.
	UpstreamStatus int
	// Retryable says the same request may succeed if tried again.
	Retryable bool
	// Err is the cause, in this process only (it does not cross).
	Err error
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" && e.Err != nil {
		msg = e.Err.Error()
	}
	if msg == "" {
		return e.Kind.String()
	}
	return e.Kind.String() + ": " + msg
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is an *Error of the same Kind, so that the
// sentinels below match any error of their kind.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Kind == e.Kind && t.Message == "" && t.Err == nil
}

// Sentinels, one per kind, for errors.Is.
var (
	ErrInternal        = &Error{Kind: KindInternal}
	ErrInvalidRequest  = &Error{Kind: KindInvalidRequest}
	ErrUnauthenticated = &Error{Kind: KindUnauthenticated}
	ErrRateLimited     = &Error{Kind: KindRateLimited}
	ErrModelNotFound   = &Error{Kind: KindModelNotFound}
	ErrUnavailable     = &Error{Kind: KindUnavailable}
	ErrUpstream        = &Error{Kind: KindUpstream}
	ErrUnsupported     = &Error{Kind: KindUnsupported}
)

// Errorf returns an *Error of kind with a formatted message. A %w verb
// wraps its argument as the cause.
func Errorf(kind Kind, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{Kind: kind, Message: err.Error(), Err: errors.Unwrap(err)}
}

// KindOf returns the Kind of err: the Kind of the first *Error in its chain,
// KindInternal for any other non-nil error, 0 for nil.
func KindOf(err error) Kind {
	if err == nil {
		return 0
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindInternal
}

// KindForHTTPStatus maps an upstream HTTP status to a Kind, for adapters
// whose servers speak HTTP.
func KindForHTTPStatus(status int) Kind {
	switch {
	case status == 400 || status == 422:
		return KindInvalidRequest
	case status == 401 || status == 403:
		return KindUnauthenticated
	case status == 404:
		return KindModelNotFound
	case status == 429:
		return KindRateLimited
	case status == 502 || status == 503 || status == 504:
		return KindUnavailable
	default:
		return KindUpstream
	}
}
