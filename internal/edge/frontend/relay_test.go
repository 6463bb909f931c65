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

// flushCounter counts the flushes that reach the client, and keeps what
// the first one carried.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes int
	first   string
}

func (f *flushCounter) Flush() {
	if f.flushes == 0 {
		f.first = f.Body.String()
	}
	f.flushes++
}

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
// The first event is flushed at once even when others came with it (issue
// 25): they merge with what follows it, never hold it.
func TestRelayFlushesOnceForEventsThatArrivedTogether(t *testing.T) {
	cases := []struct {
		name        string
		here        int // of the five events (four texts, the terminal), arrived at once
		wantFlushes int
	}{
		{"each alone", 0, 5},
		{"three together, then one at a time", 3, 4},
		{"all together", 5, 2},
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
			if fc.first != "a" {
				t.Errorf("the first flush carried %q, want the first event alone", fc.first)
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

// queuedTunnel yields its reads; here of them (the first) arrived at once,
// the rest come one at a time.
type queuedTunnel struct {
	Tunnel // only NextPiece and Ready are called
	reads  []string
	here   int
}

func (t *queuedTunnel) NextPiece() ([]byte, error) {
	if len(t.reads) == 0 {
		return nil, io.EOF
	}
	p := []byte(t.reads[0])
	t.reads = t.reads[1:]
	if t.here > 0 {
		t.here--
	}
	return p, nil
}

func (t *queuedTunnel) Ready() bool { return t.here > 0 }

// passWriter relays a tunnel's body as it comes.
type passWriter struct{}

func (passWriter) Head(*wirepb.TunnelResponseHead) {}
func (passWriter) Pass(p []byte) []byte            { return p }
func (passWriter) Flush() []byte                   { return nil }
func (passWriter) Ended() (*Failure, bool)         { return nil, false }
func (passWriter) Usage() (int64, int64, bool)     { return 0, 0, false }
func (passWriter) Fail(*Failure) []byte            { return nil }

// A relayed body's first read goes to the client at once, even when the
// reads after it had arrived with it (a burst); those leave in one flush.
func TestRelayTunnelFlushesTheFirstReadAtOnce(t *testing.T) {
	fc := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
	x := NewExchange(fc, httptest.NewRequest("POST", "/", nil), "test", nil, nil)
	l := &life{x: x, resp: newResponse(x)}
	tun := &queuedTunnel{here: 4, reads: []string{"a\n", "b\n", "c\n", "d\n"}}
	if f := l.relayTunnel(tun, &wirepb.TunnelResponseHead{Status: 200}, passWriter{}); f != nil {
		t.Fatalf("relay failed: %v", f)
	}
	if fc.first != "a\n" || fc.flushes != 2 || fc.Body.String() != "a\nb\nc\nd\n" {
		t.Errorf("%d flushes, the first carried %q; the client got %q; want 2, the first line alone, every line",
			fc.flushes, fc.first, fc.Body.String())
	}
}
