package sched

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Refusal reasons: machine names for response headers, logs and metrics.
const (
	// ReasonNoCandidate: no ready Node offers the model at all (503).
	ReasonNoCandidate = "no_candidate"
	// ReasonQueueFull: every slot is busy and the queue may not grow (429).
	ReasonQueueFull = "queue_full"
	// ReasonQueueTimeout: the request waited its queue timeout for a slot
	// (429).
	ReasonQueueTimeout = "queue_timeout"
)

// Sentinels for errors.Is; a *RefusalError matches the one of its Reason.
var (
	ErrNoCandidate  = errors.New(ReasonNoCandidate)
	ErrQueueFull    = errors.New(ReasonQueueFull)
	ErrQueueTimeout = errors.New(ReasonQueueTimeout)
)

// retryAfter is the hint given with busy refusals. The queue drains at the
// pace of generations, seconds each, so a client that comes back after a
// second finds a changed picture without hammering the Edge.
const retryAfter = time.Second

// RefusalError says why Acquire gave no slot. Callers answer Busy refusals
// with 429 and Retry-After, the others with 503.
type RefusalError struct {
	// Reason is one of the Reason* names.
	Reason string
	// Model is what the request asked for.
	Model string
	// RetryAfter suggests when to try again; zero when the reason is not
	// about load.
	RetryAfter time.Duration
	// Detail is a short human-readable explanation.
	Detail string
}

func (e *RefusalError) Error() string {
	msg := fmt.Sprintf("%s for model %q", strings.ReplaceAll(e.Reason, "_", " "), e.Model)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// Is makes errors.Is(err, ErrQueueFull) and the like hold for the refusal's
// reason.
func (e *RefusalError) Is(target error) bool {
	switch target {
	case ErrNoCandidate:
		return e.Reason == ReasonNoCandidate
	case ErrQueueFull:
		return e.Reason == ReasonQueueFull
	case ErrQueueTimeout:
		return e.Reason == ReasonQueueTimeout
	}
	return false
}

// Busy reports whether the refusal is about load (candidates exist but
// every slot is taken) rather than the absence of any candidate.
func (e *RefusalError) Busy() bool {
	return e.Reason == ReasonQueueFull || e.Reason == ReasonQueueTimeout
}
