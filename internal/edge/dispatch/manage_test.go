package dispatch

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// viewNodes is Nodes that tells its Nodes' views (as ServerNodes does)
// and keeps the last tunnel it was asked to open.
type viewNodes struct {
	*fakeFleet
	views []fleet.NodeView
	node  string
	req   *wirepb.TunnelRequest
	body  string
}

func (n *viewNodes) Snapshot() []fleet.NodeView { return n.views }

func (n *viewNodes) Tunnel(_ context.Context, nodeID string, req *wirepb.TunnelRequest, body io.Reader) (TunnelStream, error) {
	b, _ := io.ReadAll(body)
	n.node, n.req, n.body = nodeID, req, string(b)
	return &fakeStream{first: answers}, nil
}

// Issue 23: model management sees every Node the Edge knows, with its
// online providers of the adapter and why it cannot take a call now.
func TestManagedNodesSayWhichNodesTakeACall(t *testing.T) {
	online := func(name, adapter string, targets ...string) fleet.ProviderView {
		return fleet.ProviderView{Name: name, Adapter: adapter, State: "online", Targets: targets}
	}
	nodes := &viewNodes{fakeFleet: newFakeFleet(nil, nil), views: []fleet.NodeView{
		{ID: "n1", State: fleet.Ready, Dispatchable: true, Labels: map[string]string{"gpu": "a"}, Providers: []fleet.ProviderView{
			online("ollama", "ollama", "m:latest"), online("vllm", "openai", "x"), {Name: "down", Adapter: "ollama", State: "offline"}, online("second", "ollama")}},
		{ID: "n2", State: fleet.Ready, Suspect: true, Providers: []fleet.ProviderView{online("ollama", "ollama")}},
		{ID: "n3", State: fleet.Fenced, FenceReason: "heartbeat_timeout"},
		{ID: "n4", State: fleet.Registering},
	}}
	d := New(loopConfig(t), nodes.fakeFleet, nodes, Options{Logger: slog.New(slog.DiscardHandler)})
	got := d.ManagedNodes("ollama")
	if len(got) != 4 {
		t.Fatalf("%d nodes: %+v", len(got), got)
	}
	if n := got[0]; n.Unavailable != "" || n.Labels["gpu"] != "a" || len(n.Providers) != 2 ||
		n.Providers[0].Name != "ollama" || n.Providers[0].Targets[0] != "m:latest" || n.Providers[1].Name != "second" {
		t.Errorf("n1: %+v, want its two online Ollama providers", n)
	}
	for i, want := range []string{"suspect", "heartbeat_timeout", "not ready (registering)"} {
		if n := got[i+1]; !strings.Contains(n.Unavailable, want) {
			t.Errorf("%s: unavailable %q, want it to say %q", n.ID, n.Unavailable, want)
		}
	}
}

// A management tunnel is the flag, one named provider and no target, no
// lease, no deadline, the management stall timeout, and the body's length.
func TestManageOpensAManagementTunnel(t *testing.T) {
	nodes := &viewNodes{fakeFleet: newFakeFleet(nil, nil)}
	d := New(loopConfig(t), nodes.fakeFleet, nodes, Options{Logger: slog.New(slog.DiscardHandler)})
	req := &wirepb.TunnelRequest{Method: "POST", Path: "/api/pull", Target: "x", Metadata: true, DeadlineUnixMs: 5, SealedLease: []byte("l"),
		Headers: []*wirepb.Header{{Name: "Content-Length", Value: "1"}}}
	ts, err := d.Manage(t.Context(), "n1", "ollama", req, []byte(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	ts.Close()
	r := nodes.req
	if nodes.node != "n1" || !r.GetManagement() || r.GetMetadata() || r.GetProvider() != "ollama" || r.GetTarget() != "" ||
		r.GetDeadlineUnixMs() != 0 || r.GetResponseStallTimeoutMs() != ManageStallTimeout || r.GetSealedLease() != nil ||
		!strings.HasPrefix(r.GetTunnelId(), "mgmt-") || nodes.body != `{"model":"m"}` {
		t.Fatalf("node %s, request %v, body %q", nodes.node, r, nodes.body)
	}
	if hs := r.GetHeaders(); len(hs) != 1 || hs[0].GetValue() != "13" {
		t.Errorf("headers %v, want one Content-Length of 13", hs)
	}
}
