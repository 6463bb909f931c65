// Package frontendtest is the one fake the client APIs' tests share: a
// frontend.Dispatcher whose runs, tunnels and embedding calls play
// scripts, and which records what the front end asked of it. A script is
// made of Steps: run events (Text, Completed, Ended...) or body pieces of
// a tunnel (Line, Chunk), each given after its delay (After) or once its
// gate is closed (Gated). Work whose script is used up says nothing until
// it is cancelled, as a provider in a long prefill does.
package frontendtest

import (
	"time"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Step is one scripted piece of work: a run event, or a piece of a
// tunnel's body.
type Step struct {
	Event *wirepb.RunEvent
	Data  string
	Delay time.Duration
	Gate  <-chan struct{}
}

// Events of a run.
func Text(s string) Step {
	return event(wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, func(e *wirepb.RunEvent) { e.Text = s })
}
func Reasoning(s string) Step {
	return event(wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA, func(e *wirepb.RunEvent) { e.Text = s })
}

// ToolCall is a tool call, or a fragment of the call of its index.
func ToolCall(index int32, id, name, args string) Step {
	return event(wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA, func(e *wirepb.RunEvent) {
		e.ToolCall = &wirepb.ToolCall{Index: index, Id: id, Name: name, ArgumentsJson: []byte(args)}
	})
}

// Usage is a usage event of prompt and completion tokens.
func Usage(prompt, completion int64) Step {
	return event(wirepb.RunEventType_RUN_EVENT_TYPE_USAGE, func(e *wirepb.RunEvent) {
		e.Usage = &wirepb.Usage{PromptTokens: prompt, CompletionTokens: completion}
	})
}

// Completed is the COMPLETED terminal with its done reason.
func Completed(reason string) Step {
	return event(wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, func(e *wirepb.RunEvent) { e.DoneReason = reason })
}

// Failed is a FAILED terminal of kind.
func Failed(kind wirepb.FailureKind, msg string) Step {
	return Ended(wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, kind, msg)
}

// Ended is a terminal of type t, with a failure when kind or msg is set; a
// RESPONSE_STALLED one carries Stall.
func Ended(t wirepb.RunEventType, kind wirepb.FailureKind, msg string) Step {
	return event(t, func(e *wirepb.RunEvent) {
		if kind != wirepb.FailureKind_FAILURE_KIND_UNSPECIFIED || msg != "" {
			e.Failure = &wirepb.Failure{Kind: kind, Message: msg}
		}
		if t == wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED {
			e.Stall = Stall
		}
	})
}

func event(t wirepb.RunEventType, set func(*wirepb.RunEvent)) Step {
	e := &wirepb.RunEvent{Type: t}
	set(e)
	return Step{Event: e}
}

// Line is a line of a tunnel's body; Chunk any piece of it.
func Line(s string) Step  { return Step{Data: s + "\n"} }
func Chunk(s string) Step { return Step{Data: s} }

// After gives s after d.
func After(d time.Duration, s Step) Step { s.Delay = d; return s }

// Gated gives s once gate is closed.
func Gated(gate <-chan struct{}, s Step) Step { s.Gate = gate; return s }

// TunnelEnd is how a tunnel's body ends other than completed: outcome o,
// with a failure when kind or msg is set; a RESPONSE_STALLED one carries
// Stall.
func TunnelEnd(o wirepb.TunnelOutcome, kind wirepb.FailureKind, msg string) error {
	te := &nodeserver.TunnelError{Outcome: o}
	if o == wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED {
		te.Stall = Stall
	}
	if kind != wirepb.FailureKind_FAILURE_KIND_UNSPECIFIED || msg != "" {
		te.Failure = &wirepb.Failure{Kind: kind, Message: msg}
	}
	return te
}

// Stall is the observation of the stalled terminals Ended and TunnelEnd
// make; StallText is how every API words it.
var Stall = &wirepb.StallObservation{StallTimeoutMs: 2000, SinceLastProgressMs: 2000, CloseConfirmed: true,
	ProviderHealth: "available", LivenessClassification: "request_stalled", HealthObservationSeq: 1, Retryable: true}

// StallText is how the failure of Stall reads.
const StallText = "the provider stopped responding: no progress for 2s (stall timeout 2s); provider health available, classification request_stalled"

// Embedded is a completed embedding call with vectors and its prompt
// tokens.
func Embedded(prompt int64, vectors ...[]float32) *dispatch.Embedding {
	e := &dispatch.Embedding{ID: "emb-1", Terminal: &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED,
		Usage: &wirepb.Usage{PromptTokens: prompt}}}
	for _, v := range vectors {
		e.Vectors = append(e.Vectors, &wirepb.Vector{Values: v})
	}
	return e
}

// Offer is a model of the inventory served by one candidate of each of
// adapters, on Node n1.
func Offer(id string, adapters ...string) dispatch.Offering {
	o := dispatch.Offering{ID: id}
	for _, a := range adapters {
		o.Candidates = append(o.Candidates, sched.Candidate{NodeID: "n1", Provider: a, Adapter: a, Target: id, Capabilities: capsOf(a)})
	}
	return o
}

func capsOf(adapter string) []string {
	if adapter == "ollama" || adapter == "openai" || adapter == "simulator" {
		return []string{dispatch.CapEmbed, dispatch.CapComplete}
	}
	return nil
}
