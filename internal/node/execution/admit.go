package execution

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// admission is what a provider call (a run, a tunnel or an embedding
// call) asks of admit.
type admission struct {
	// kind is what the call counts as in metrics: nodemetrics.Run, ...
	kind                      string
	stallMs                   int64
	provider, adapter, target string
	// capability, if not "", must be one the serving plugin reports.
	capability string
	// noSlot admits without a capacity slot: a read-only metadata call
	// answers while the provider is busy.
	noSlot  bool
	sealed  []byte
	binding *wirepb.LeaseBinding
}

// admitted is a provider call ready to be made.
type admitted struct {
	prov    *Provider
	plugin  Plugin
	release func() // gives the capacity slot back
	cred    *sdk.Credential
	stall   time.Duration
	// route, for a tunnel to an adapter that gives one, is how the Node
	// reaches the server itself; nil: the plugin relays.
	route *sdk.TunnelRoute
}

// admit takes a provider call through the Node's checks, in their order:
// the raw stall timeout (R4: refused before any provider lookup or adapter
// call), the provider, capacity admission, the capability of the plugin
// that would serve it (not of the last one reported: a restart may bring
// another adapter build), and last the lease (R11: opened after admission,
// immediately before the provider call; a refusal makes no call and tries
// no other credential, S4). A refusal is the failure the call ends with;
// nothing is held then, and the refusal is counted (on the provider, once
// it is known).
func (h *Handler) admit(sess *transport.Session, a admission) (*admitted, *wirepb.Failure) {
	var prov *Provider
	refused := func(f *wirepb.Failure) (*admitted, *wirepb.Failure) {
		h.ended(a.kind, prov, refusedOutcome(f))
		return nil, f
	}
	refuse := func(kind wirepb.FailureKind, format string, args ...any) (*admitted, *wirepb.Failure) {
		return refused(&wirepb.Failure{Kind: kind, Message: fmt.Sprintf(format, args...)})
	}
	stall, err := StallTimeout(a.stallMs)
	if err != nil {
		return refuse(wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST, "%v", err)
	}
	prov, err = h.set.Lookup(a.provider, a.adapter, a.target)
	if err != nil {
		return refuse(wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND, "%v", err)
	}
	var (
		plugin  Plugin
		release = func() {}
	)
	if a.noSlot {
		plugin, err = prov.Current()
	} else {
		plugin, release, err = prov.AcquireFor(a.target)
	}
	var route *sdk.TunnelRoute
	if err == nil && a.capability == sdk.CapTunnel {
		route = prov.tunnelRoute() // a route serves tunnels without the plugin's Tunnel
	}
	switch {
	case errors.Is(err, ErrCapacityExhausted):
		return refuse(wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED, "%v", err)
	case err != nil:
		return refuse(wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, "%v", err)
	case a.capability != "" && route == nil && !slices.Contains(plugin.Capabilities(), a.capability):
		release()
		return refuse(wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED, "provider %s (adapter %s) does not %s", prov.Name(), prov.cfg.Adapter, capabilityWork(a.capability))
	}
	cred, rejected := h.openLease(sess, a.sealed, a.binding, prov.Name(), a.target)
	if rejected != nil {
		release()
		return refused(rejected)
	}
	return &admitted{prov: prov, plugin: plugin, release: release, cred: cred, stall: stall, route: route}, nil
}

// refuseBusy refuses a call its provider has no slot for with
// quicwire.StreamBusy, before the first byte, when the Edge it came from
// reads that code (edgeclient.BusyRefusals): the Edge then moves the work
// to another candidate or back to its queue, as for any refusal before the
// first byte. The Node's slots are shared by every Edge it is connected to
// (issue 22), so an Edge's own count of them can be behind. It reports
// whether it refused; otherwise the caller ends the call with f as its
// terminal, as for an Edge that does not read the code.
// provider, adapter and target are the call's, to count the refusal on its
// provider.
func (h *Handler) refuseBusy(ctx context.Context, st Stream, f *wirepb.Failure, provider, adapter, target string) bool {
	if f.GetKind() != wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED || !edgeclient.BusyRefusals(ctx) {
		return false
	}
	c, ok := st.(interface{ Cancel(quicwire.StreamCode) })
	if !ok {
		return false
	}
	c.Cancel(quicwire.StreamBusy)
	if p, err := h.set.Lookup(provider, adapter, target); err == nil {
		p.busy.Add(1)
		p.metrics.Busy()
	}
	return true
}

// capabilityWork says what a capability lets an adapter do, for refusals.
func capabilityWork(capability string) string {
	switch capability {
	case sdk.CapTunnel:
		return "relay its raw API"
	case sdk.CapEmbed:
		return "compute embeddings"
	case sdk.CapComplete:
		return "run raw completions"
	case sdk.CapCountTokens:
		return "count tokens"
	}
	return "implement " + capability
}

// guard makes the guard of an admitted call, whose context ends with the
// connection (ctx), the hard deadline, the Edge's cancel or a stall,
// whichever comes first (the guard claims the outcome once), and watches st
// for the Edge's cancel: on a run or embed stream the Edge sends nothing
// after the header, so a reset of the stream is how a cancel arrives
// (R10). It resets both halves: where st can tell that its write side
// ended (a QUIC stream, on the Edge's STOP_SENDING), that is watched
// without a goroutine, so a waiting run holds none for it (issue 25);
// otherwise a goroutine reads st for the reset.
func (a *admitted) guard(ctx context.Context, h *Handler, sess *transport.Session, target string, deadlineMs int64, st Stream) *guard {
	g := h.newGuard(ctx, guardSpec{sess: sess, prov: a.prov, plugin: a.plugin, target: target, stall: a.stall, deadlineMs: deadlineMs})
	if sctx := sendContext(st); sctx != nil {
		g.unwatch = context.AfterFunc(sctx, func() { g.stop(writeSideEnded(context.Cause(sctx))) })
	} else {
		go watchCancel(st, g.stop)
	}
	return g
}
