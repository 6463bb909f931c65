package gateway

import (
	"context"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/live"
	"github.com/iop-dev/iop/internal/edge/nodes"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// liveFleet is a gateway with a tracker over one ready Node whose provider
// "chat" (capacity 1) serves "m" and neither embeds nor completes.
func liveFleet(t *testing.T) (*Gateway, *sched.Scheduler, *live.Tracker) {
	t.Helper()
	cfg, err := edgeconfig.Parse([]byte(`
listen: {http: "127.0.0.1:8080", quic: "127.0.0.1:7443"}
identity: {mode: loopback}
profiles: [{name: default, queue_timeout: 1m, max_queue_depth: 4}]
`))
	if err != nil {
		t.Fatal(err)
	}
	reg := nodes.New(nodes.Options{})
	s := sched.New(reg, sched.Options{})
	tr := live.New(live.Options{})
	g := New(cfg, s, nodeserver.NewServer(nodeserver.Options{}, reg), Options{Live: tr})
	c := reg.Register(nodes.ConnInfo{NodeID: "n1"})
	if err := reg.MarkReady(c, c.Generation(), []*wirepb.Provider{{Name: "chat", Adapter: "openai", Capacity: 1,
		State: wirepb.ProviderState_PROVIDER_STATE_ONLINE, Targets: []*wirepb.Target{{Name: "m"}}}}); err != nil {
		t.Fatal(err)
	}
	return g, s, tr
}

var anyone = auth.Principal{Name: "alice", Routes: []string{edgeconfig.AllRoutes}}

// Work that never starts is tracked from its resolution to its refusal,
// and counted with the code its client is answered with: the status page's
// terminals agree with what clients saw.
func TestWorkThatNeverStartsIsCountedWithItsClientsCode(t *testing.T) {
	g, _, tr := liveFleet(t)
	x := NewExchange(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/chat/completions", nil), "openai_completions", nil, nil)
	ctx := x.Begin(time.Minute)
	defer x.End()

	completion := &wirepb.RunRequest{Completion: &wirepb.CompletionInput{Prompt: "p"}}
	if _, err := g.StartRun(ctx, anyone, "m", completion, nil); err == nil {
		t.Fatal("a raw completion on a chat-only model started")
	}
	if _, err := g.Embed(t.Context(), anyone, "m", &wirepb.EmbedRequest{Inputs: []string{"x"}}, nil, nil); err == nil {
		t.Fatal("embeddings of a chat-only model started")
	}
	if _, err := g.StartRun(t.Context(), anyone, "ghost", &wirepb.RunRequest{}, nil); err == nil {
		t.Fatal("a run for a model nobody offers started")
	}
	// Refused before it is work: a principal that may not use the model.
	if _, err := g.StartRun(t.Context(), auth.Principal{Name: "bob"}, "m", &wirepb.RunRequest{}, nil); err == nil {
		t.Fatal("a forbidden run started")
	}

	s := tr.Snapshot()
	if len(s.Live) != 0 {
		t.Errorf("live = %+v, want nothing", s.Live)
	}
	if got := s.Terminals.Totals; got["unsupported"] != 2 || got["model_not_found"] != 1 || len(got) != 2 {
		t.Errorf("terminals = %v, want 2 unsupported and 1 model_not_found (the forbidden one was never work)", got)
	}
	if len(s.Recent) != 3 {
		t.Fatalf("recent = %+v, want 3", s.Recent)
	}
	run, embed := s.Recent[2], s.Recent[1]
	if run.Kind != live.Run || run.API != "openai_completions" || !run.StartedAt.Equal(x.Arrived) || run.Principal != "alice" || run.Model != "m" {
		t.Errorf("the completion = %+v, want a run of openai_completions from alice, started when its request arrived", run)
	}
	if embed.Kind != live.Embed || embed.API != "" {
		t.Errorf("the embedding call = %+v, want an embed with no API (no exchange)", embed)
	}
}

// A request that waits for a slot shows as queued, and one whose client
// leaves while it waits ends "cancelled", as its client API records it.
func TestQueuedWorkShowsAsQueuedAndEndsWithItsCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g, s, tr := liveFleet(t)
		go s.Run(t.Context())
		held, err := s.Acquire(t.Context(), sched.Request{ID: "holder", Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release()

		x := NewExchange(httptest.NewRecorder(), httptest.NewRequest("POST", "/api/chat", nil), "ollama_chat", nil, nil)
		ctx := x.Begin(time.Minute)
		defer x.End()
		done := make(chan error, 1)
		go func() {
			_, err := g.StartTunnel(ctx, anyone, "m", "", &wirepb.TunnelRequest{}, func(string) ([]byte, error) { return nil, nil }, nil)
			done <- err
		}()
		synctest.Wait()
		sn := tr.Snapshot()
		if len(sn.Live) != 1 || sn.Live[0].Phase != live.Queued || sn.Live[0].Kind != live.Tunnel || sn.Live[0].API != "ollama_chat" || sn.Live[0].Node != "" {
			t.Fatalf("live = %+v, want one queued ollama_chat tunnel, on no Node yet", sn.Live)
		}

		x.Stop(ErrClientGone)
		if err := <-done; context.Cause(ctx) != ErrClientGone || err == nil {
			t.Fatalf("start after the client left: %v (cause %v)", err, context.Cause(ctx))
		}
		sn = tr.Snapshot()
		if len(sn.Live) != 0 || len(sn.Recent) != 1 || sn.Recent[0].Reason != "cancelled" {
			t.Errorf("after the client left: live %+v recent %+v, want it ended cancelled", sn.Live, sn.Recent)
		}
	})
}

// The hot path: a token of a run costs no allocation on the tracker's side.
func TestSeeingATokenAllocatesNothing(t *testing.T) {
	tr := live.New(live.Options{})
	r := &Run{ctx: context.Background(), live: tr.Start(live.Work{Kind: live.Run, ID: "r"})}
	ev := &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: "tok"}
	r.see(ev)
	if a := testing.AllocsPerRun(1000, func() { r.see(ev) }); a != 0 {
		t.Errorf("a token allocates %v times", a)
	}
	v := tr.Snapshot().Live[0]
	if v.Phase != live.Streaming || v.Tokens != 1002 || v.TTFTMillis == nil {
		t.Errorf("after 1002 tokens: %+v, want streaming with 1002 tokens and a time to first token", v)
	}
	r.see(&wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, Usage: &wirepb.Usage{PromptTokens: 3, CompletionTokens: 1002}})
	s := tr.Snapshot()
	if len(s.Live) != 0 || s.Recent[0].Reason != live.Completed || s.Recent[0].CompletionTokens != 1002 || s.Recent[0].PromptTokens != 3 {
		t.Errorf("after the terminal: %+v", s)
	}
}
