package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/node/nodejoin"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/enroll"
)

// `noded join` tries again when the Edge is busy or cannot be reached, so
// that a Node provisioned while strangers hold the Edge's join slots, or
// while the Edge is still starting, joins once it can (issue 24 gap 6). It
// never tries again after the Edge has answered about the token: a
// refusal (unknown, used, expired token; an Edge that does not issue
// certificates; a token of another Edge) is final, and printed as it came.

// retryPolicy says how long to wait between attempts and how long to keep
// trying.
type retryPolicy struct {
	// first is the wait after the first failed attempt; each next wait is
	// twice the one before, up to most.
	first, most time.Duration
	// total bounds the retrying: no attempt starts once it has passed
	// since the first began; 0 makes one attempt only.
	total time.Duration
	// jitter is the wait actually taken for a backoff of d (so that Nodes
	// started together do not come back together); nil: uniform in
	// [d/2, d].
	jitter func(d time.Duration) time.Duration
}

// defaultRetryFor is --retry-for's default.
const defaultRetryFor = 2 * time.Minute

func joinRetry(total time.Duration) retryPolicy {
	return retryPolicy{first: time.Second, most: 30 * time.Second, total: total}
}

// halfJitter is a wait uniform in [d/2, d].
func halfJitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

// retrying runs try until it succeeds, fails for good (retryable says
// which failures are worth another attempt), ctx ends, or p.total has
// passed. Before each wait it prints why and for how long to out. The
// error is the last attempt's, saying so when retrying gave up.
func retrying[T any](ctx context.Context, out io.Writer, p retryPolicy, try func(context.Context) (T, error)) (T, error) {
	jitter := p.jitter
	if jitter == nil {
		jitter = halfJitter
	}
	began := time.Now()
	backoff := p.first
	for attempt := 1; ; attempt++ {
		v, err := try(ctx)
		if err == nil {
			return v, nil
		}
		why, again := retryable(err)
		if !again || ctx.Err() != nil || p.total <= 0 {
			return v, err
		}
		wait := jitter(backoff)
		if time.Since(began)+wait > p.total {
			return v, fmt.Errorf("%w (gave up after %d attempts in %s; --retry-for sets how long to keep trying)",
				err, attempt, time.Since(began).Round(time.Second))
		}
		fmt.Fprintf(out, "==> %s, retrying in %s\n", why, roundWait(wait))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, fmt.Errorf("%w (interrupted while waiting to try again)", err)
		case <-t.C:
		}
		backoff = min(2*backoff, p.most)
	}
}

// roundWait is d as printed: tenths of a second below 10 s, seconds above.
func roundWait(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}

// retryable reports whether a failed join is worth another attempt, and
// why, as printed: the Edge was busy (it closed the join connection with
// quicwire.CloseRefused, which on a join connection means "not now": all
// of its join slots, or this address's, were taken, or the request came
// too late), or the network failed on the way (no answer in time, a
// timeout, an Edge that restarted under the connection, a DNS server that
// did not answer). Everything else is final: the Edge's answer about the
// token, a certificate that does not match the token, an Edge that does
// not take joins, a local error.
func retryable(err error) (why string, ok bool) {
	var refused *enroll.JoinError
	switch {
	case errors.As(err, &refused),
		errors.Is(err, enroll.ErrForeignEdge), errors.Is(err, enroll.ErrNotAnEdgeCert), errors.Is(err, enroll.ErrUnavailable),
		errors.Is(err, nodejoin.ErrAlreadyJoined), errors.Is(err, context.Canceled):
		return "", false
	}
	var (
		idle  *quic.IdleTimeoutError
		hs    *quic.HandshakeTimeoutError
		reset *quic.StatelessResetError
		te    *quic.TransportError
		dns   *net.DNSError
		op    *net.OpError
		ne    net.Error
	)
	if cc, closed := quicwire.CloseReason(err); closed && cc.Transport == nil {
		if cc.Remote && cc.Code == quicwire.CloseRefused {
			return fmt.Sprintf("edge busy (%s)", cc.Detail), true
		}
		return "", false
	}
	switch {
	case errors.As(err, &te):
		// The Edge's QUIC stack refuses a connection it has no room for
		// (its accept queue is full); any other transport error (a TLS
		// alert, a protocol violation) is final.
		if te.ErrorCode == quic.ConnectionRefused && te.Remote {
			return "edge busy (it refused the connection)", true
		}
		return "", false
	case errors.As(err, &hs):
		return "edge unreachable (no answer to the handshake)", true
	case errors.As(err, &idle):
		return "edge unreachable (the connection went silent)", true
	case errors.As(err, &reset):
		return "edge unreachable (it lost the connection: restarted?)", true
	case errors.As(err, &dns):
		if dns.IsTimeout || dns.IsTemporary {
			return "edge address unresolved (" + dns.Err + ")", true
		}
		return "", false
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("edge unreachable (no answer within %s)", enroll.JoinTimeout), true
	case errors.As(err, &op):
		return "network error (" + op.Err.Error() + ")", true
	case errors.As(err, &ne) && ne.Timeout():
		return "edge unreachable (timed out)", true
	}
	return "", false
}
