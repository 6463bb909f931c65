package pluginpb

import "github.com/iop-dev/iop/quicwire/wirepb"

// The failure-kind table, shared by both sides of the plugin boundary. The
// keys are sdk.Kind values (this package cannot import sdk, which imports
// it); sdk's tests check the table against sdk's kinds.
var kindToWire = map[int]wirepb.FailureKind{
	1: wirepb.FailureKind_FAILURE_KIND_INTERNAL,             // sdk.KindInternal
	2: wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST,      // sdk.KindInvalidRequest
	3: wirepb.FailureKind_FAILURE_KIND_UNAUTHENTICATED,      // sdk.KindUnauthenticated
	4: wirepb.FailureKind_FAILURE_KIND_RATE_LIMITED,         // sdk.KindRateLimited
	5: wirepb.FailureKind_FAILURE_KIND_MODEL_NOT_FOUND,      // sdk.KindModelNotFound
	6: wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE, // sdk.KindUnavailable
	7: wirepb.FailureKind_FAILURE_KIND_UPSTREAM,             // sdk.KindUpstream
	8: wirepb.FailureKind_FAILURE_KIND_UNSUPPORTED,          // sdk.KindUnsupported
}

var kindFromWire = func() map[wirepb.FailureKind]int {
	m := make(map[wirepb.FailureKind]int, len(kindToWire))
	for k, w := range kindToWire {
		m[w] = k
	}
	return m
}()

// internalKind is sdk.KindInternal.
const internalKind = 1

// KindToWire maps an sdk.Kind to its wire kind. An unknown kind is internal.
func KindToWire(kind int) wirepb.FailureKind {
	if w, ok := kindToWire[kind]; ok {
		return w
	}
	return wirepb.FailureKind_FAILURE_KIND_INTERNAL
}

// KindFromWire maps a wire kind back to an sdk.Kind. Kinds an adapter never
// produces (capacity_exhausted, lease_rejected, protocol, unspecified) are
// internal: they are the Node's to claim, not a plugin's.
func KindFromWire(kind wirepb.FailureKind) int {
	if k, ok := kindFromWire[kind]; ok {
		return k
	}
	return internalKind
}

// NewFailure returns the wire Failure of an adapter error's parts.
func NewFailure(kind int, message string, retryable bool, upstreamStatus int) *wirepb.Failure {
	return &wirepb.Failure{
		Kind:           KindToWire(kind),
		Message:        message,
		Retryable:      retryable,
		UpstreamStatus: int32(upstreamStatus),
	}
}
