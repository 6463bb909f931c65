package sdk

import (
	"encoding/json"
	"math"
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// EmbedRequest is one embedding call.
type EmbedRequest struct {
	// EmbedID identifies the call; use it in logs.
	EmbedID string
	// SessionID is an opaque correlation id (S1).
	SessionID string
	// Target is the model.
	Target string
	// Inputs are the texts to embed: at least one, none empty.
	Inputs []string
	// Dimensions is the length the vectors should have, for a model
	// trained for shortened embeddings; 0 means the model's own.
	Dimensions int
	// Extra holds the client's request fields that the Edge does not
	// interpret ({"user":"u1"}, Ollama's "truncate" or "options"), as one
	// JSON object; an adapter passes what its server knows (SPEC P2).
	Extra json.RawMessage
	// Deadline is the call's hard deadline; ctx carries it too.
	Deadline time.Time
	// StallTimeout is the provider's response-stall timeout (R4): the
	// Node's watchdog fails a call that returns nothing for that long.
	StallTimeout time.Duration
	// Credential is the secret to present upstream for this call only, or
	// nil. Never log it, never store it.
	Credential *Credential
}

// EmbedResult is a completed embedding call.
type EmbedResult struct {
	// Vectors are the embeddings, one per input, in input order, all of
	// the same length.
	Vectors [][]float32
	// Usage is the token accounting (PromptTokens), if the server
	// reported it.
	Usage *Usage
}

// checkEmbedRequest refuses a call outside the wire's bounds before the
// adapter sees it (the Node refuses it too; this guards a host that does
// not).
func checkEmbedRequest(r *wirepb.EmbedRequest) error {
	switch n := len(r.GetInputs()); {
	case n == 0:
		return Errorf(KindInvalidRequest, "embed: no inputs")
	case n > wirepb.MaxEmbedInputs:
		return Errorf(KindInvalidRequest, "embed: %d inputs, more than the %d a call may have", n, wirepb.MaxEmbedInputs)
	}
	for i, in := range r.GetInputs() {
		if in == "" {
			return Errorf(KindInvalidRequest, "embed: input %d is empty", i)
		}
	}
	if d := r.GetDimensions(); d > wirepb.MaxEmbedDimensions {
		return Errorf(KindInvalidRequest, "embed: %d dimensions asked, more than %d", d, wirepb.MaxEmbedDimensions)
	}
	return nil
}

// checkEmbedResult checks an adapter's result against the request as it
// came (not as the adapter may have changed it): one vector per input, all
// of one length within the bounds, no longer than the dimensions asked
// for, every value finite. Its error is KindUpstream: the server answered
// something unusable.
func checkEmbedResult(req *wirepb.EmbedRequest, res *EmbedResult) error {
	if res == nil {
		return Errorf(KindInternal, "embed: the adapter returned no result")
	}
	asked := int(req.GetDimensions())
	if len(res.Vectors) != len(req.GetInputs()) {
		return Errorf(KindUpstream, "embed: %d vectors for %d inputs", len(res.Vectors), len(req.GetInputs()))
	}
	dims := len(res.Vectors[0])
	switch {
	case dims == 0:
		return Errorf(KindUpstream, "embed: empty vectors")
	case dims > wirepb.MaxEmbedDimensions:
		return Errorf(KindUpstream, "embed: vectors of %d dimensions, more than %d", dims, wirepb.MaxEmbedDimensions)
	case asked > 0 && dims > asked:
		return Errorf(KindUpstream, "embed: vectors of %d dimensions where %d were asked for (the server ignored dimensions)", dims, asked)
	case dims*len(res.Vectors) > wirepb.MaxEmbedValues:
		return Errorf(KindUpstream, "embed: %d vectors of %d dimensions, more than the %d values a result may have",
			len(res.Vectors), dims, wirepb.MaxEmbedValues)
	}
	for i, v := range res.Vectors {
		if len(v) != dims {
			return Errorf(KindUpstream, "embed: vector %d has %d dimensions, vector 0 has %d", i, len(v), dims)
		}
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return Errorf(KindUpstream, "embed: vector %d holds a value that is not a finite number", i)
			}
		}
	}
	return nil
}
