package execution

import (
	"context"
	"io"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// Issue 23: a raw tunnel to a path that changes what the model server
// holds is refused unless it is a management tunnel, however the path is
// spelt; it never reaches the plugin or the server. Other paths pass.
func TestManagementPathsNeedTheManagementFlag(t *testing.T) {
	for _, c := range []struct {
		path    string
		refused bool
	}{
		{"/api/pull", true},
		{"/api/delete", true},
		{"/api/copy", true},
		{"/api/create", true},
		{"/api/push", true},
		{"/api/blobs/sha256:0123abcd", true},
		{"/API/Pull", true},
		{"/api//delete", true},
		{"/api/chat/../pull", true},
		{"%2Fapi%2Fcreate", true},
		{"/api/pull?stream=false", true},
		{"api/copy", true},
		{"/api/chat", false},
		{"/api/show", false},
		{"/api/tags", false},
		{"/api/pulls", false},
		{"/api/blobsx", false},
	} {
		t.Run(c.path, func(t *testing.T) {
			pl := newTunnelPlugin(echo)
			_, h := onlineSet(t, 1, pl)
			st := newFakeTunnelStream(true, "{}")
			req := tunnelReq("t1")
			req.Path = c.path
			serveTunnelOn(h, t.Context(), req, st)
			sent, _ := st.frames()
			_, _, term := requireTunnelOrder(t, sent)
			if !c.refused {
				if term.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED || pl.calls.Load() != 1 {
					t.Fatalf("terminal %v, plugin calls %d: want it relayed", term, pl.calls.Load())
				}
				return
			}
			if f := term.GetFailure(); f.GetKind() != wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST || f.GetReason() != managementOnlyReason {
				t.Fatalf("terminal %v, want an invalid_request %s refusal", term, managementOnlyReason)
			}
			if pl.calls.Load() != 0 {
				t.Fatal("the plugin was called")
			}

			// The same request as a management tunnel is relayed.
			st = newFakeTunnelStream(true, "{}")
			req.Management = true
			serveTunnelOn(h, t.Context(), req, st)
			sent, _ = st.frames()
			if _, _, term := requireTunnelOrder(t, sent); term.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED || pl.calls.Load() != 1 {
				t.Fatalf("management tunnel: terminal %v, plugin calls %d", term, pl.calls.Load())
			}
		})
	}
}

// terminalWatch is a tunnel stream that calls onTerminal when the Node
// sends the terminal, before recording it.
type terminalWatch struct {
	*fakeTunnelStream
	onTerminal func()
}

func (s *terminalWatch) Send(m proto.Message) error {
	if m.(*wirepb.TunnelFrame).GetTerminal() != nil {
		s.onTerminal()
	}
	return s.fakeTunnelStream.Send(m)
}

// Issue 23: a management tunnel takes no capacity slot (a pull lasts
// minutes), and when it ends the provider lists its models again at once,
// long before its relist interval, and before the terminal goes: the
// status update with the pulled model is on its way as the pull ends.
func TestManagementTunnelTakesNoSlotAndRelistsBeforeItsTerminal(t *testing.T) {
	srv := &modelServer{}
	srv.serve("old:latest")
	pl := newTunnelPlugin(func(_ context.Context, req *wirepb.TunnelRequest, body io.Reader, emit func(*wirepb.TunnelFrame) error) error {
		if _, err := io.ReadAll(body); err != nil {
			return err
		}
		srv.serve("old:latest", "new:latest") // the pull wrote its manifest
		if err := emit(headFrame(200)); err != nil {
			return err
		}
		if err := emit(bodyFrame(`{"status":"success"}` + "\n")); err != nil {
			return err
		}
		return emit(terminalFrame(completed))
	})
	pl.caps, pl.list = []string{sdk.CapTunnel, sdk.CapListTargets}, srv.list
	_, prov, h := startSet(t, ProviderConfig{Name: "ollama", Adapter: "ollama", Capacity: 1, RelistInterval: time.Hour}, pl, HandlerOptions{})
	if !prov.Serves("old:latest") || prov.Serves("new:latest") {
		t.Fatalf("targets before the pull: %v", prov.Wire().GetTargets())
	}
	_, release, err := prov.Acquire() // every slot busy
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	lists := pl.lists.Load()

	listedAtTerminal := false
	st := &terminalWatch{fakeTunnelStream: newFakeTunnelStream(true, `{"model":"new"}`),
		onTerminal: func() { listedAtTerminal = prov.Serves("new:latest") }}
	defer st.cancel()
	req := &wirepb.TunnelRequest{TunnelId: "m1", Provider: "ollama", Method: "POST", Path: "/api/pull", Management: true}
	h.serveTunnel(t.Context(), nil, req, st)

	sent, _ := st.frames()
	if _, body, term := requireTunnelOrder(t, sent); term.GetOutcome() != wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED || string(body) != `{"status":"success"}`+"\n" {
		t.Fatalf("body %q terminal %v: want the pull relayed while every slot is busy", body, term)
	}
	if pl.lists.Load() != lists+1 {
		t.Errorf("%d listings after the management tunnel, want 1", pl.lists.Load()-lists)
	}
	if !listedAtTerminal {
		t.Error("the pulled model was not among the provider's targets when the terminal was sent")
	}
}

// A tunnel that is not a management one does not make the provider list
// its models again.
func TestOrdinaryTunnelDoesNotRelist(t *testing.T) {
	srv := &modelServer{}
	srv.serve("m")
	pl := newTunnelPlugin(echo)
	pl.caps, pl.list = []string{sdk.CapTunnel, sdk.CapListTargets}, srv.list
	_, _, h := startSet(t, ProviderConfig{Name: "ollama", Adapter: "ollama", Capacity: 1, RelistInterval: time.Hour}, pl, HandlerOptions{})
	lists := pl.lists.Load()
	st := newFakeTunnelStream(true, "{}")
	serveTunnelOn(h, t.Context(), &wirepb.TunnelRequest{TunnelId: "t1", Provider: "ollama", Target: "m", Method: "POST", Path: "/api/chat"}, st)
	if pl.lists.Load() != lists {
		t.Errorf("a chat tunnel listed the models %d times", pl.lists.Load()-lists)
	}
}
