package quicwire

// Health evidence vocabulary (R6), shared by the Node that produces it and
// the Edge that acts on it. A StallObservation carries exactly one of the
// pairs provider_health / liveness_classification:
//
//	available   / request_stalled     the provider answers; this request stalled
//	unavailable / provider_unhealthy  the exact target does not answer its probe
//	unknown     / health_unknown      the probe erred, timed out or was ambiguous
const (
	HealthAvailable   = "available"
	HealthUnavailable = "unavailable"
	HealthUnknown     = "unknown"

	LivenessRequestStalled    = "request_stalled"
	LivenessProviderUnhealthy = "provider_unhealthy"
	LivenessHealthUnknown     = "health_unknown"
)

// TargetHealthUnavailable is the wire Target.health of a provider target
// the Node found unavailable after a stall and is re-probing. The Edge keeps
// it out of selection until the Node reports it back.
const TargetHealthUnavailable = "unavailable"
