package openai_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
	"github.com/iop-dev/iop/plugins/openai"
	"github.com/iop-dev/iop/sdk"
)

// sink records events; with goneAfter > 0 it answers ErrHostGone from that
// event on, like a host whose run was cancelled.
type sink struct {
	mu        sync.Mutex
	events    []sdk.Event
	goneAfter int
	arrived   chan struct{} // receives after each recorded event, if set
}

func (s *sink) Send(_ context.Context, ev sdk.Event) error {
	s.mu.Lock()
	if s.goneAfter > 0 && len(s.events) >= s.goneAfter {
		s.mu.Unlock()
		return sdk.ErrHostGone
	}
	s.events = append(s.events, ev)
	s.mu.Unlock()
	if s.arrived != nil {
		select {
		case s.arrived <- struct{}{}:
		default:
		}
	}
	return nil
}

func (s *sink) all() []sdk.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sdk.Event(nil), s.events...)
}

// summary renders events compactly: "t:Hel r:think c0:id/name/{ u:3/4".
func summary(evs []sdk.Event) string {
	var b []string
	for _, ev := range evs {
		switch ev.Kind {
		case sdk.TextDelta:
			b = append(b, "t:"+ev.Text)
		case sdk.ReasoningDelta:
			b = append(b, "r:"+ev.Text)
		case sdk.ToolCallDelta:
			tc := ev.ToolCall
			b = append(b, "c"+itoa(int64(tc.Index))+":"+tc.ID+"/"+tc.Name+"/"+tc.Arguments)
		case sdk.UsageReport:
			b = append(b, "u:"+itoa(ev.Usage.PromptTokens)+"/"+itoa(ev.Usage.CompletionTokens))
		}
	}
	return strings.Join(b, " ")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// assembled concatenates tool-call fragments per index, as a host would.
func assembled(evs []sdk.Event) map[int]sdk.ToolCall {
	out := map[int]sdk.ToolCall{}
	for _, ev := range evs {
		if ev.Kind != sdk.ToolCallDelta {
			continue
		}
		tc := out[ev.ToolCall.Index]
		tc.Index = ev.ToolCall.Index
		tc.ID += ev.ToolCall.ID
		tc.Name += ev.ToolCall.Name
		tc.Arguments += ev.ToolCall.Arguments
		out[tc.Index] = tc
	}
	return out
}

// configured returns an adapter configured for baseURL.
func configured(t *testing.T, baseURL string) *openai.Adapter {
	t.Helper()
	a := openai.New()
	if err := a.Configure(t.Context(), sdk.MustConfig(map[string]any{"base_url": baseURL})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(context.Background()) })
	return a
}

func startFake(t *testing.T, cfg fakeopenai.Config) *fakeopenai.Server {
	t.Helper()
	s := fakeopenai.Start(cfg)
	t.Cleanup(s.Close)
	return s
}

func userRun(target, text string) *sdk.Request {
	return &sdk.Request{RunID: "run-1", Target: target, Messages: []sdk.Message{{Role: "user", Content: text}}}
}
