package wirepb

// Bounds of an embedding call (EmbedRequest, EmbedFrame), shared by the
// Edge, which refuses a request past them before dispatch and a result past
// them as a protocol error, the Node, which refuses them before the adapter
// is called, and the SDK, which cuts an adapter's vectors into frames.
const (
	// MaxEmbedInputs bounds the inputs of one call: OpenAI's own limit.
	MaxEmbedInputs = 2048
	// MaxEmbedDimensions bounds the length of one vector, so that one
	// vector always fits a frame.
	MaxEmbedDimensions = 1 << 16
	// MaxEmbedValues bounds the values of a whole result (inputs ×
	// dimensions): 2048 vectors of 4096, 32 MiB of float32, which the Edge
	// holds until it answers.
	MaxEmbedValues = MaxEmbedInputs * 4096
	// MaxEmbedFrameValues bounds the values of one EmbedVectors frame:
	// 256 KiB of float32, well inside a dispatched stream's 1 MiB frame
	// with the per-vector framing.
	MaxEmbedFrameValues = MaxEmbedDimensions
)
