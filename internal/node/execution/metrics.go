package execution

import (
	"strings"

	"github.com/iop-dev/iop/internal/node/nodemetrics"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// ended counts a provider call's terminal: of kind (nodemetrics.Run, ...),
// on prov (nil for a call refused before its provider was found), with
// outcome o. It runs once per call, when its one terminal is decided
// (admit, for a refusal), never per event.
func (h *Handler) ended(kind string, prov *Provider, o Outcome) {
	m := h.unnamed
	if prov != nil {
		m = prov.metrics
	}
	failure := ""
	if o.Cause == CauseFailed {
		failure = failureName(o.Failure.GetKind())
	}
	m.Ended(kind, o.Cause.String(), failure)
}

// failureName is a failure kind's name as a label: "rate_limited", ...;
// "failed" for an unspecified kind.
func failureName(k wirepb.FailureKind) string {
	if k == wirepb.FailureKind_FAILURE_KIND_UNSPECIFIED {
		return "failed"
	}
	return strings.ToLower(strings.TrimPrefix(k.String(), "FAILURE_KIND_"))
}

// tunnelKind is a tunnel's kind of call: a metadata call takes no slot and
// is counted apart, so that model listings do not read as work.
func tunnelKind(req *wirepb.TunnelRequest) string {
	if req.GetMetadata() {
		return nodemetrics.Metadata
	}
	return nodemetrics.Tunnel
}
