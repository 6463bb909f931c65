package dispatch

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Issue 21: a request past one frame goes only to a Node that takes it
// (RegisterRequest.max_request_bytes); when no Node serving the model
// does, the request is too large (413), saying the largest they take.
func TestALargeRequestGoesOnlyToANodeThatTakesIt(t *testing.T) {
	d, reg := overRegistry(t, "profiles: [{name: default, queue_timeout: 1s}]\n")
	ready := func(node string, maxRequest int, model string) {
		readyNode(t, reg, fleet.ConnInfo{NodeID: node, MaxRequest: maxRequest}, &wirepb.Provider{Name: "p", Adapter: "ollama", Capacity: 1,
			State: wirepb.ProviderState_PROVIDER_STATE_ONLINE, Targets: []*wirepb.Target{{Name: model}}})
	}
	ready("old", 0, "m")       // an older Node: one frame
	ready("small", 8<<20, "m") // 8 MiB
	ready("big", 64<<20, "m")  // 64 MiB
	ready("older", 0, "solo")
	plan := func(model string, size int) Plan {
		p := planFor(t, d, model)
		p.Size = size
		return p
	}
	for _, c := range []struct {
		size  int
		nodes []string
	}{
		{100, []string{"big", "old", "small"}},
		{transport.OneFrameHeader, []string{"big", "old", "small"}},
		{transport.OneFrameHeader + 1, []string{"big", "small"}},
		{20 << 20, []string{"big"}},
	} {
		seen := map[string]bool{}
		for range 3 {
			slot, err := d.acquire(t.Context(), "r", new(plan("m", c.size)), nil, nil)
			if err != nil {
				t.Fatalf("size %d: %v", c.size, err)
			}
			seen[slot.Candidate().NodeID] = true
			slot.Release()
		}
		for n := range seen {
			if !slices.Contains(c.nodes, n) {
				t.Errorf("size %d went to %q, which takes less; want one of %v", c.size, n, c.nodes)
			}
		}
	}
	_, err := d.StartRun(t.Context(), new(plan("m", 65<<20)), &wirepb.RunRequest{}, Watch{})
	if !errors.Is(err, ErrRequestTooLarge) || !strings.Contains(err.Error(), "at most 67108864") {
		t.Errorf("a request past every Node's limit: %v, want ErrRequestTooLarge naming 64 MiB", err)
	}
	_, err = d.StartRun(t.Context(), new(plan("solo", 2<<20)), &wirepb.RunRequest{}, Watch{})
	if !errors.Is(err, ErrRequestTooLarge) {
		t.Errorf("a request past one frame to a model only an older Node serves: %v, want ErrRequestTooLarge", err)
	}
}
