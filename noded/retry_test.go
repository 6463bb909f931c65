package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/node/nodejoin"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/enroll"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// busy is how enroll.Join fails when the Edge closed the join connection
// because its join slots were taken.
func busy() error {
	return fmt.Errorf("join: read answer: %w", &quic.ApplicationError{Remote: true,
		ErrorCode: quic.ApplicationErrorCode(quicwire.CloseRefused), ErrorMessage: "too many joins at once; try again"})
}

// usedToken is the Edge's refusal of a token already used.
func usedToken() error {
	return &enroll.JoinError{Refusal: wirepb.JoinRefusal_JOIN_REFUSAL_USED_TOKEN, Detail: "token t for node n1 was used at 2026-01-01T00:00:00Z"}
}

// script is a join attempt that fails with errs in turn, then succeeds.
type script struct {
	errs  []error
	calls int
	at    []time.Duration // when each attempt began, since the first
	began time.Time
}

func (s *script) try(context.Context) (string, error) {
	if s.calls == 0 {
		s.began = time.Now()
	}
	s.at = append(s.at, time.Since(s.began))
	s.calls++
	if len(s.errs) > 0 {
		err := s.errs[0]
		s.errs = s.errs[1:]
		return "", err
	}
	return "joined", nil
}

func noJitter(d time.Duration) time.Duration { return d }

// P5, issue 24 gap 6: an Edge that is busy twice is tried again after 1 s,
// then 2 s, saying so each time, and the third attempt joins.
func TestJoinRetriesABusyEdgeWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{errs: []error{busy(), busy()}}
		var out strings.Builder
		p := joinRetry(defaultRetryFor)
		p.jitter = noJitter
		got, err := retrying(t.Context(), &out, p, s.try)
		if err != nil || got != "joined" {
			t.Fatalf("retrying = %q, %v", got, err)
		}
		if want := []time.Duration{0, time.Second, 3 * time.Second}; fmt.Sprint(s.at) != fmt.Sprint(want) {
			t.Errorf("attempts at %v, want %v", s.at, want)
		}
		want := "==> edge busy (too many joins at once; try again), retrying in 1s\n" +
			"==> edge busy (too many joins at once; try again), retrying in 2s\n"
		if out.String() != want {
			t.Errorf("printed\n%s\nwant\n%s", out.String(), want)
		}
	})
}

// The waits double up to 30 s, with jitter each in [d/2, d], and no
// attempt starts once --retry-for has passed: the last attempt's error
// comes back, saying retrying gave up.
func TestJoinRetryGivesUpAfterRetryFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{errs: make([]error, 1000)}
		for i := range s.errs {
			s.errs[i] = busy()
		}
		var out strings.Builder
		var asked []time.Duration
		p := joinRetry(2 * time.Minute)
		inner := halfJitter
		p.jitter = func(d time.Duration) time.Duration {
			asked = append(asked, d)
			w := inner(d)
			if w < d/2 || w > d {
				t.Errorf("jitter of %s gave %s, want within [%s, %s]", d, w, d/2, d)
			}
			return w
		}
		began := time.Now()
		_, err := retrying(t.Context(), &out, p, s.try)
		took := time.Since(began)
		if err == nil || !strings.Contains(err.Error(), "too many joins at once") || !strings.Contains(err.Error(), "gave up after") {
			t.Fatalf("err = %v; want the Edge's last answer and that retrying gave up", err)
		}
		if cc, ok := quicwire.CloseReason(err); !ok || cc.Code != quicwire.CloseRefused {
			t.Errorf("the error lost its cause: %v", err)
		}
		if took > 2*time.Minute {
			t.Errorf("retried for %s, past --retry-for", took)
		}
		if want := "[1s 2s 4s 8s 16s 30s 30s"; !strings.HasPrefix(fmt.Sprint(asked), want) {
			t.Errorf("backoffs %v, want them to start %s...", asked, want)
		}
		if n := strings.Count(out.String(), "retrying in"); n != s.calls-1 {
			t.Errorf("%d waits printed for %d attempts", n, s.calls)
		}
	})
}

// A refused token is final: one attempt, its message as it came, nothing
// printed about retrying.
func TestJoinDoesNotRetryARefusedToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{errs: []error{usedToken()}}
		var out strings.Builder
		_, err := retrying(t.Context(), &out, joinRetry(defaultRetryFor), s.try)
		if !errors.Is(err, enroll.ErrTokenUsed) || s.calls != 1 || out.Len() != 0 {
			t.Errorf("err %v after %d attempts, printed %q; want the refusal at once", err, s.calls, out.String())
		}
	})
}

// --retry-for 0 tries once.
func TestJoinRetryForZeroTriesOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &script{errs: []error{busy()}}
		var out strings.Builder
		if _, err := retrying(t.Context(), &out, joinRetry(0), s.try); err == nil || s.calls != 1 || out.Len() != 0 {
			t.Errorf("err %v after %d attempts, printed %q", err, s.calls, out.String())
		}
	})
}

// An interrupt while waiting ends the wait at once.
func TestJoinRetryWaitEndsWithTheContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		s := &script{errs: []error{busy(), busy()}}
		var out strings.Builder
		p := joinRetry(defaultRetryFor)
		p.jitter = func(time.Duration) time.Duration { return time.Minute }
		time.AfterFunc(5*time.Second, cancel)
		began := time.Now()
		_, err := retrying(ctx, &out, p, s.try)
		if err == nil || !strings.Contains(err.Error(), "interrupted") || time.Since(began) != 5*time.Second || s.calls != 1 {
			t.Errorf("err %v after %s and %d attempts", err, time.Since(began), s.calls)
		}
	})
}

// Which failures are worth another attempt.
func TestJoinRetryableFailures(t *testing.T) {
	appClose := func(code quicwire.CloseCode, remote bool) error {
		return fmt.Errorf("join: %w", &quic.ApplicationError{Remote: remote, ErrorCode: quic.ApplicationErrorCode(code), ErrorMessage: "x"})
	}
	for _, tt := range []struct {
		name  string
		err   error
		again bool
	}{
		{"the Edge's join slots are taken", busy(), true},
		{"no join request in time", appClose(quicwire.CloseRefused, true), true},
		{"the Edge's QUIC stack has no room", fmt.Errorf("dial edge: %w", &quic.TransportError{Remote: true, ErrorCode: quic.ConnectionRefused}), true},
		{"no answer to the handshake", fmt.Errorf("dial edge: %w", &quic.HandshakeTimeoutError{}), true},
		{"a silent connection", fmt.Errorf("join: %w", &quic.IdleTimeoutError{}), true},
		{"the Edge restarted", fmt.Errorf("join: %w", &quic.StatelessResetError{}), true},
		{"the join timed out", fmt.Errorf("join: %w", context.DeadlineExceeded), true},
		{"no route", fmt.Errorf("dial edge: %w", &net.OpError{Op: "write", Net: "udp", Err: errors.New("sendmsg: network is unreachable")}), true},
		{"DNS did not answer", fmt.Errorf("edge address: %w", &net.DNSError{Err: "i/o timeout", Name: "edge", IsTimeout: true}), true},

		{"an unknown token", &enroll.JoinError{Refusal: wirepb.JoinRefusal_JOIN_REFUSAL_UNKNOWN_TOKEN}, false},
		{"a used token", usedToken(), false},
		{"an expired token", &enroll.JoinError{Refusal: wirepb.JoinRefusal_JOIN_REFUSAL_EXPIRED_TOKEN}, false},
		{"an Edge without the CA key", &enroll.JoinError{Refusal: wirepb.JoinRefusal_JOIN_REFUSAL_UNAVAILABLE}, false},
		{"a token of another Edge", fmt.Errorf("%w (the token names CA sha256:ab)", enroll.ErrForeignEdge), false},
		{"an Edge that takes no joins", fmt.Errorf("%w: the Edge at x does not take joins", enroll.ErrUnavailable), false},
		{"a certificate that is no Edge's", fmt.Errorf("edge x: %w", enroll.ErrNotAnEdgeCert), false},
		{"a TLS alert", fmt.Errorf("dial edge: %w", &quic.TransportError{Remote: true, ErrorCode: 0x100 + 42}), false},
		{"the Node closed it", appClose(quicwire.CloseRefused, false), false},
		{"a protocol error", appClose(quicwire.CloseProtocolError, true), false},
		{"an unknown host", fmt.Errorf("edge address: %w", &net.DNSError{Err: "no such host", Name: "edgee", IsNotFound: true}), false},
		{"already joined", fmt.Errorf("dir %w", nodejoin.ErrAlreadyJoined), false},
		{"interrupted", context.Canceled, false},
		{"a local error", errors.New("make key: out of entropy"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			why, again := retryable(tt.err)
			if again != tt.again || again == (why == "") {
				t.Errorf("retryable(%v) = %q, %t; want %t", tt.err, why, again, tt.again)
			}
		})
	}
}
