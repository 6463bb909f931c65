package sdk

import (
	"context"
	"errors"
	"testing"

	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// fakeRunStream is the server side of an Execute stream, in memory.
type fakeRunStream struct {
	pluginpb.Adapter_ExecuteServer
	ctx  context.Context
	sent []*wirepb.RunEvent
}

func (s *fakeRunStream) Context() context.Context { return s.ctx }

func (s *fakeRunStream) Send(ev *wirepb.RunEvent) error {
	s.sent = append(s.sent, ev)
	return nil
}

// Send numbers events from 1 and stamps the run's ids; the terminal comes
// last; after it, and once the host has gone, Send returns ErrHostGone.
func TestEventSinkStampsEventsAndRefusesThemWhenTheRunIsOver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream := &fakeRunStream{ctx: ctx}
	sink := &eventSink{stream: stream, ctx: ctx, runID: "r", sessionID: "s"}
	for range 2 {
		if err := sink.Send(ctx, Event{Kind: TextDelta, Text: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := sink.finish(terminalEvent(&Result{DoneReason: "stop"}, nil)); err != nil {
		t.Fatal(err)
	}
	if err := sink.Send(ctx, Event{Kind: TextDelta, Text: "late"}); !errors.Is(err, ErrHostGone) {
		t.Errorf("Send after the terminal: %v", err)
	}
	if len(stream.sent) != 3 {
		t.Fatalf("sent %d events", len(stream.sent))
	}
	for i, ev := range stream.sent {
		if ev.GetSeq() != uint64(i+1) || ev.GetRunId() != "r" || ev.GetSessionId() != "s" {
			t.Errorf("event %d: %v", i, ev)
		}
	}
	if stream.sent[2].GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED {
		t.Errorf("last event %v", stream.sent[2])
	}

	gone, stop := context.WithCancel(context.Background())
	stop()
	sink = &eventSink{stream: &fakeRunStream{ctx: gone}, ctx: gone}
	if err := sink.Send(context.Background(), Event{Kind: TextDelta}); !errors.Is(err, ErrHostGone) {
		t.Errorf("Send after the host went: %v", err)
	}
}
