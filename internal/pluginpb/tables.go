package pluginpb

import (
	"net/http"
	"slices"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The tables both sides of the plugin boundary share: failure kinds,
// health statuses and HTTP headers. sdk (the plugin side) and pluginhost
// (the host side) each keep their own conversions of the sdk types, in one
// convert.go each; what both need of the same mapping lives here, because
// sdk cannot import pluginhost and this package cannot import sdk. The
// integer keys are sdk values; sdk's tests check the tables against them.

// kindToWire maps sdk.Kind values to wire failure kinds.
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

var kindFromWire = invert(kindToWire)

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

// healthToWire maps sdk.HealthStatus values to the protocol's statuses.
var healthToWire = map[int]HealthStatus{
	0: HealthStatus_HEALTH_STATUS_UNKNOWN,     // sdk.HealthUnknown
	1: HealthStatus_HEALTH_STATUS_AVAILABLE,   // sdk.HealthAvailable
	2: HealthStatus_HEALTH_STATUS_UNAVAILABLE, // sdk.HealthUnavailable
}

var healthFromWire = invert(healthToWire)

// HealthToWire maps an sdk.HealthStatus to the protocol's status. An
// unknown value is unknown.
func HealthToWire(status int) HealthStatus {
	return healthToWire[status] // the zero value is HEALTH_STATUS_UNKNOWN
}

// HealthFromWire maps the protocol's status back to an sdk.HealthStatus.
// A status this side does not know is unknown (sdk.HealthUnknown, 0).
func HealthFromWire(status HealthStatus) int {
	return healthFromWire[status]
}

// HeadersToWire flattens h in a stable order: names sorted, each name's
// values in their order.
func HeadersToWire(h http.Header) []*wirepb.Header {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	var out []*wirepb.Header
	for _, name := range names {
		for _, v := range h[name] {
			out = append(out, &wirepb.Header{Name: name, Value: v})
		}
	}
	return out
}

// HeadersFromWire rebuilds the http.Header of headers (never nil). Names
// are canonicalized, as http.Header.Add does.
func HeadersFromWire(headers []*wirepb.Header) http.Header {
	h := make(http.Header, len(headers))
	for _, kv := range headers {
		h.Add(kv.GetName(), kv.GetValue())
	}
	return h
}

// invert returns the inverse of a one-to-one table.
func invert[K, V comparable](m map[K]V) map[V]K {
	out := make(map[V]K, len(m))
	for k, v := range m {
		out[v] = k
	}
	return out
}
