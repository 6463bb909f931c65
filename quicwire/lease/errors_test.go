package lease_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/iop-dev/iop/quicwire/lease"
)

func TestRejectedErrorSaysItsReasonAndIsErrRejected(t *testing.T) {
	var err error = &lease.RejectedError{Reason: lease.Stale, Detail: "generation 6, want 7"}
	if got, want := err.Error(), "lease rejected (stale): generation 6, want 7"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	wrapped := fmt.Errorf("run r1: %w", err)
	if !errors.Is(wrapped, lease.ErrRejected) {
		t.Fatal("not ErrRejected")
	}
	if errors.Is(wrapped, lease.ErrReplayCacheFull) {
		t.Fatal("a refusal is ErrReplayCacheFull")
	}
	if r, ok := lease.ReasonOf(wrapped); !ok || r != lease.Stale {
		t.Fatalf("ReasonOf = %q, %v", r, ok)
	}
	if _, ok := lease.ReasonOf(errors.New("other")); ok {
		t.Fatal("ReasonOf found a reason in a plain error")
	}
}

// The reasons are part of the contract (S4): exactly these eight.
func TestReasonsAreTheContractsEight(t *testing.T) {
	for _, r := range []lease.Reason{lease.Revoked, lease.Disabled, lease.Expired, lease.Stale, lease.Replayed,
		lease.WrongRecipient, lease.Mismatched, lease.Malformed} {
		if !r.Valid() {
			t.Errorf("%q is not valid", r)
		}
	}
	want := "revoked disabled expired stale replayed wrong_recipient mismatched malformed"
	got := strings.Join([]string{string(lease.Revoked), string(lease.Disabled), string(lease.Expired), string(lease.Stale),
		string(lease.Replayed), string(lease.WrongRecipient), string(lease.Mismatched), string(lease.Malformed)}, " ")
	if got != want {
		t.Fatalf("reasons %q, want %q", got, want)
	}
	for _, r := range []lease.Reason{"", "ok", "Expired", "wrong-recipient"} {
		if r.Valid() {
			t.Errorf("%q is valid", r)
		}
	}
}

// No way of printing or logging a Lease shows its secret.
func TestLeaseNeverPrintsItsSecret(t *testing.T) {
	l, err := newOpener(newClock(t0)).Open(issue(t, claims("lease-1")), binding())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T"} {
		out = append(out, fmt.Sprintf(verb, l), fmt.Sprintf(verb, *l))
	}
	out = append(out, l.String(), fmt.Sprint(l), fmt.Sprintln(*l))
	var logged bytes.Buffer
	for _, h := range []slog.Handler{slog.NewTextHandler(&logged, nil), slog.NewJSONHandler(&logged, nil)} {
		slog.New(h).Info("opened", "lease", l, "value", *l)
	}
	out = append(out, logged.String())
	hexSecret := fmt.Sprintf("%x", testSecret)
	for _, s := range out {
		if strings.Contains(s, testSecret) || strings.Contains(strings.ToLower(s), hexSecret) || strings.Contains(s, "115 107 45") {
			t.Fatalf("printed the secret: %s", s)
		}
	}
	if !strings.Contains(logged.String(), "lease-1") || !strings.Contains(l.String(), `"lease-1"`) {
		t.Fatalf("the claims are missing: %s / %s", l, logged.String())
	}
}
