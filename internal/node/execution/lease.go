package execution

import (
	"errors"
	"fmt"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire/lease"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// openLease opens the sealed credential lease a run or tunnel carries, if
// any (R11). It is called after capacity admission and immediately before
// the provider call, so a request refused for capacity never opens (and
// never burns) its lease. Every check fails closed (S4): a refusal is a
// lease_rejected failure naming the reason, and the caller makes no
// provider call and falls back to no other credential.
//
// The lease is checked against the request at hand: the binding the Edge
// sent beside it (principal, route, slot, profile), the provider and
// target this Node resolved, this Node, and the current connection's
// generation. The secret goes to the adapter in memory for this call only.
func (h *Handler) openLease(sess *transport.Session, sealed []byte, b *wirepb.LeaseBinding, provider, target string) (*sdk.Credential, *wirepb.Failure) {
	if len(sealed) == 0 {
		return nil, nil
	}
	reject := func(reason lease.Reason, detail string) *wirepb.Failure {
		h.metrics.LeaseRefused(string(reason))
		return &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_LEASE_REJECTED, Reason: string(reason),
			Message: fmt.Sprintf("credential lease rejected (%s): %s", reason, detail)}
	}
	switch {
	case h.leases == nil:
		return nil, reject(lease.Malformed, "this Node has no lease key configured")
	case sess == nil:
		return nil, reject(lease.Stale, "the request is not bound to a connection")
	}
	l, err := h.leases.Open(sealed, lease.Binding{
		Principal:  b.GetPrincipal(),
		Route:      b.GetRoute(),
		Slot:       b.GetSlot(),
		Profile:    b.GetProfile(),
		Target:     target,
		Provider:   provider,
		NodeID:     sess.NodeID(),
		Generation: sess.Generation(),
	})
	var re *lease.RejectedError
	switch {
	case errors.As(err, &re):
		h.log.Warn("credential lease rejected", "reason", re.Reason, "detail", re.Detail, "provider", provider, "target", target)
		return nil, reject(re.Reason, re.Detail)
	case errors.Is(err, lease.ErrReplayCacheFull):
		// Not the lease's fault and not burned: the Edge may try elsewhere.
		return nil, &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED, Retryable: true,
			Message: "credential lease not opened: " + err.Error()}
	case err != nil:
		return nil, reject(lease.Malformed, err.Error())
	}
	defer l.Wipe()
	return &sdk.Credential{Kind: "bearer", Secret: string(l.Secret)}, nil
}
