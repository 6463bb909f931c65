package pluginhost_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// Capabilities are derived from what the adapter implements: an adapter
// without Probe reports no probe, and Probe on it is unsupported.
func TestCapabilitiesAreHonest(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		full, _ := start(t, false)
		want := []string{sdk.CapListTargets, sdk.CapTunnel, sdk.CapProbe, sdk.CapClose, sdk.CapComplete, sdk.CapEmbed}
		if got := full.Capabilities(); !slices.Equal(got, want) {
			t.Errorf("full adapter capabilities %v, want %v", got, want)
		}
		if full.Info().Name != "testadapter" || full.Info().ConfigFields["prefix"] == "" {
			t.Errorf("info %+v", full.Info())
		}

		minimal, _ := start(t, true)
		if got := minimal.Capabilities(); len(got) != 0 {
			t.Errorf("minimal adapter capabilities %v, want none", got)
		}
		if _, err := minimal.Probe(t.Context(), "x"); !errors.Is(err, sdk.ErrUnsupported) {
			t.Errorf("Probe on an adapter without it: %v", err)
		}
		if _, err := minimal.ListTargets(t.Context()); !errors.Is(err, sdk.ErrUnsupported) {
			t.Errorf("ListTargets on an adapter without it: %v", err)
		}
		err := minimal.Tunnel(t.Context(), &wirepb.TunnelRequest{}, nil, nil, func(*wirepb.TunnelFrame) error { return nil })
		if !errors.Is(err, sdk.ErrUnsupported) {
			t.Errorf("Tunnel on an adapter without it: %v", err)
		}
		_, err = minimal.Execute(t.Context(), &wirepb.RunRequest{Target: "text:1", Completion: &wirepb.CompletionInput{Prompt: "p"}}, nil,
			func(*wirepb.RunEvent) error { t.Error("an event of a completion the adapter cannot run"); return nil })
		if !errors.Is(err, sdk.ErrUnsupported) {
			t.Errorf("a raw completion on an adapter without Complete: %v", err)
		}
		if _, err := minimal.Embed(t.Context(), &wirepb.EmbedRequest{Inputs: []string{"x"}}, nil, nil); !errors.Is(err, sdk.ErrUnsupported) {
			t.Errorf("Embed on an adapter without it: %v", err)
		}
		if err := minimal.Close(t.Context()); err != nil {
			t.Errorf("Close on an adapter without Close: %v", err)
		}
	})
}

func TestListTargetsAndProbe(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		targets, err := p.ListTargets(t.Context())
		if err != nil || !slices.Equal(targets, []sdk.Target{{Name: "text:3"}, {Name: "tools"}}) {
			t.Errorf("ListTargets = %v, %v", targets, err)
		}
		for target, want := range map[string]sdk.HealthStatus{"up": sdk.HealthAvailable, "down": sdk.HealthUnavailable} {
			h, err := p.Probe(t.Context(), target)
			if err != nil || h.Status != want || h.Detail == "" {
				t.Errorf("Probe(%q) = %+v, %v", target, h, err)
			}
		}
	})
}

// R3: the tunnel relays the head, the body in order, and exactly one
// terminal.
func TestTunnelRelaysHeadBodyAndOneTerminal(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789abcdef"), 20<<10) // 320 KiB: several chunks each way
	cases := []struct {
		path    string
		head    bool
		outcome wirepb.TunnelOutcome
		kind    wirepb.FailureKind
	}{
		{"/api/chat", true, wirepb.TunnelOutcome_TUNNEL_OUTCOME_COMPLETED, 0},
		{"/fail", true, wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, wirepb.FailureKind_FAILURE_KIND_UPSTREAM},
		{"/fail-early", false, wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE},
	}
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		for _, c := range cases {
			t.Run(c.path, func(t *testing.T) {
				req := &wirepb.TunnelRequest{
					TunnelId: "tun-1", Method: "POST", Path: c.path,
					Headers:     []*wirepb.Header{{Name: "Content-Type", Value: "application/json"}},
					SealedLease: []byte("sealed"),
				}
				var frames []*wirepb.TunnelFrame
				err := p.Tunnel(t.Context(), req, &sdk.Credential{Kind: "bearer", Secret: "s"}, bytes.NewReader(body),
					func(f *wirepb.TunnelFrame) error { frames = append(frames, f); return nil })
				if err != nil {
					t.Fatal(err)
				}
				if string(req.GetSealedLease()) != "sealed" {
					t.Error("Tunnel changed the caller's request")
				}
				var got []byte
				for i, f := range frames {
					switch {
					case f.GetHead() != nil:
						if i != 0 {
							t.Errorf("head at frame %d", i)
						}
						h := map[string]string{}
						for _, kv := range f.GetHead().GetHeaders() {
							h[kv.GetName()] = kv.GetValue()
						}
						if f.GetHead().GetStatus() != 200 || h["Content-Type"] != "application/json" || h["X-Path"] != c.path ||
							h["X-Method"] != "POST" || h["X-Credential-Kind"] != "bearer" {
							t.Errorf("head %v", f.GetHead())
						}
					case f.GetTerminal() != nil:
						if i != len(frames)-1 {
							t.Errorf("terminal at frame %d of %d", i, len(frames))
						}
					default:
						got = append(got, f.GetBody()...)
					}
				}
				if (frames[0].GetHead() != nil) != c.head {
					t.Errorf("first frame %v", frames[0])
				}
				if c.head && !bytes.Equal(got, body) {
					t.Errorf("body: got %d bytes, want %d", len(got), len(body))
				}
				term := frames[len(frames)-1].GetTerminal()
				if term.GetOutcome() != c.outcome || term.GetFailure().GetKind() != c.kind {
					t.Errorf("terminal %v", term)
				}
			})
		}
	})
}

// A tunnel whose relay fails is cancelled; the body may stay unread.
func TestTunnelEmitErrorCancelsTheTunnel(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		relayErr := errors.New("client went away")
		pr, pw := io.Pipe()
		defer pw.Close()
		go func() { _, _ = pw.Write([]byte("partial body")) }()
		err := p.Tunnel(t.Context(), &wirepb.TunnelRequest{Path: "/x"}, nil, pr, func(*wirepb.TunnelFrame) error { return relayErr })
		if !errors.Is(err, relayErr) {
			t.Fatalf("Tunnel = %v", err)
		}
	})
}

// Close calls the adapter's Close, is idempotent, closes Exited, and every
// later call fails with ErrClosed (which is also unavailable).
func TestCloseIsIdempotentAndEndsThePlugin(t *testing.T) {
	eachHost(t, func(t *testing.T, start startFunc) {
		p, _ := start(t, false)
		for range 2 {
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-p.Exited():
		default:
			t.Fatal("Exited is not closed after Close")
		}
		_, _, err := collect(t.Context(), p, run("text:1"))
		if !errors.Is(err, pluginhost.ErrClosed) || !errors.Is(err, sdk.ErrUnavailable) || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("Execute after Close: %v", err)
		}
	})
}
