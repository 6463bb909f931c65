package lease

import (
	"errors"
)

// Reason says why a lease was refused. The values are part of the
// contract: the Node reports them to the Edge as a failure's sub-reason, so
// never rename one.
type Reason string

// The reasons a lease is refused (S4). See the package doc for the order
// in which they are checked.
const (
	Revoked        Reason = "revoked"
	Disabled       Reason = "disabled"
	Expired        Reason = "expired"
	Stale          Reason = "stale"
	Replayed       Reason = "replayed"
	WrongRecipient Reason = "wrong_recipient"
	Mismatched     Reason = "mismatched"
	Malformed      Reason = "malformed"
)

// Valid reports whether r is one of the reasons above, e.g. for a reason
// read back from the wire.
func (r Reason) Valid() bool {
	switch r {
	case Revoked, Disabled, Expired, Stale, Replayed, WrongRecipient, Mismatched, Malformed:
		return true
	}
	return false
}

// ErrRejected matches every *RejectedError with errors.Is.
var ErrRejected = errors.New("lease rejected")

// ErrReplayCacheFull is returned by Opener.Open when the replay cache holds
// its maximum of live lease ids, so a new lease cannot be recorded without
// forgetting one that could then be replayed. The lease is not refused for
// anything it holds and is not burned; it may be opened again once ids
// expire. Like a refusal, it means: no provider call.
var ErrReplayCacheFull = errors.New("lease replay cache full")

// RejectedError is a refused lease. Detail is for people (logs, the
// failure message); callers branch on Reason. Neither ever holds the secret.
type RejectedError struct {
	Reason Reason
	Detail string
}

func (e *RejectedError) Error() string {
	return "lease rejected (" + string(e.Reason) + "): " + e.Detail
}

// Is makes errors.Is(err, ErrRejected) true.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected }

// ReasonOf returns the reason of the *RejectedError in err's chain.
func ReasonOf(err error) (Reason, bool) {
	var re *RejectedError
	if errors.As(err, &re) {
		return re.Reason, true
	}
	return "", false
}

func reject(r Reason, detail string) *RejectedError {
	return &RejectedError{Reason: r, Detail: detail}
}
