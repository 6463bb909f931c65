package dispatch

import (
	"errors"
	"testing"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// P2, issue 12: embeddings and raw completions go only to candidates whose
// adapter reports the capability; a model served now by no such provider
// is unsupported (400, which the client can change), not unavailable, and
// a model nobody offers stays unknown.
func TestWorkOfAKindGoesOnlyToAdaptersThatDoIt(t *testing.T) {
	d, reg := overRegistry(t, "profiles: [{name: default, queue_timeout: 1s}]\n")
	readyNode(t, reg, fleet.ConnInfo{NodeID: "n1"}, &wirepb.Provider{Name: "chat", Adapter: "openai", Capacity: 1,
		Capabilities: []string{"list_targets", "tunnel"}, State: wirepb.ProviderState_PROVIDER_STATE_ONLINE,
		Targets: []*wirepb.Target{{Name: "chat-only"}}})
	plan := func(model string) Plan { return planFor(t, d, model) }

	_, err := d.Embed(t.Context(), new(plan("chat-only")), &wirepb.EmbedRequest{Inputs: []string{"x"}}, Watch{}, nil)
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("embeddings of a chat-only model: %v, want ErrUnsupported", err)
	}
	completion := &wirepb.RunRequest{Completion: &wirepb.CompletionInput{Prompt: "p"}}
	if _, err := d.StartRun(t.Context(), new(plan("chat-only")), completion, Watch{}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("a raw completion on a model no adapter completes: %v, want ErrUnsupported", err)
	}
	if _, err := d.Embed(t.Context(), new(plan("ghost")), &wirepb.EmbedRequest{Inputs: []string{"x"}}, Watch{}, nil); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("embeddings of a model nobody offers: %v, want ErrUnknownModel", err)
	}
	// Plans themselves still match by model alone: the inventory lists the
	// model for every API.
	if cs := d.Candidates(plan("chat-only")); len(cs) != 1 {
		t.Errorf("the chat-only model left the inventory: %v", cs)
	}
}
