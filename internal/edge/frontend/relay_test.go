package frontend

import (
	"io"
	"net/http/httptest"
	"testing"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// queuedRun yields its events; here of them (the first) arrived at once,
// the rest come one at a time, after the relay asked.
type queuedRun struct {
	Run    // only Next and Ready are called
	events []*wirepb.RunEvent
	here   int
}

func (r *queuedRun) Next() (*wirepb.RunEvent, error) {
	if len(r.events) == 0 {
		return nil, io.EOF
	}
	ev := r.events[0]
	r.events = r.events[1:]
	if r.here > 0 {
		r.here--
	}
	return ev, nil
}

// Ready: the next event is one of those that arrived at once.
func (r *queuedRun) Ready() bool { return r.here > 0 }

// flushCounter counts the flushes that reach the client.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes int
}

func (f *flushCounter) Flush() { f.flushes++ }

// textWriter writes each text delta as an event of the response, as the
// APIs' writers do.
type textWriter struct {
	resp *Response
	text string
}

func (w *textWriter) Started(string) {}
func (w *textWriter) Text(s string) bool {
	w.text += s
	return w.resp.Event([]byte(s))
}
func (w *textWriter) Reasoning(string) bool          { return true }
func (w *textWriter) ToolCall(*wirepb.ToolCall) bool { return true }
func (w *textWriter) Usage(*wirepb.Usage)            {}
func (w *textWriter) Complete(string) bool           { return w.resp.End(nil) }
func (w *textWriter) Fail(*Failure)                  {}
func textEvent(s string) *wirepb.RunEvent {
	return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: s}
}

// Coalescing (issue 14): events that arrived together leave in one flush;
// a lone event is flushed at once, and nothing is held after the relay.
func TestRelayFlushesOnceForEventsThatArrivedTogether(t *testing.T) {
	cases := []struct {
		name        string
		here        int // of the five events (four texts, the terminal), arrived at once
		wantFlushes int
	}{
		{"each alone", 0, 5},
		{"three together, then one at a time", 3, 3},
		{"all together", 5, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fc := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
			x := NewExchange(fc, httptest.NewRequest("POST", "/", nil), "test", nil, nil)
			w := &textWriter{resp: newResponse(x)}
			run := &queuedRun{here: c.here, events: []*wirepb.RunEvent{
				textEvent("a"), textEvent("b"), textEvent("c"), textEvent("d"),
				{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED},
			}}
			if f := x.relay(run, w); f != nil {
				t.Fatalf("relay failed: %v", f)
			}
			if fc.flushes != c.wantFlushes {
				t.Errorf("%d flushes, want %d", fc.flushes, c.wantFlushes)
			}
			if w.text != "abcd" || fc.Body.String() != "abcd" {
				t.Errorf("client got %q (writer saw %q), want every event", fc.Body.String(), w.text)
			}
			if x.more != nil {
				t.Error("the exchange still consults the run after Relay returned")
			}
		})
	}
}
