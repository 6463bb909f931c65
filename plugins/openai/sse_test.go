package openai

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestSSEReaderFollowsTheEventStreamRules(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []sseEvent
	}{
		{"plain events", "data: a\n\ndata: b\n\n", []sseEvent{{Data: "a"}, {Data: "b"}}},
		{"CRLF line endings", "data: a\r\n\r\ndata: b\r\n\r\n", []sseEvent{{Data: "a"}, {Data: "b"}}},
		{"comments and keep-alives", ": ping\n\n: OPENROUTER PROCESSING\ndata: a\n\n", []sseEvent{{Data: "a"}}},
		{"multi-line data joins with newline", "data: {\"a\":\ndata: 1}\n\n", []sseEvent{{Data: "{\"a\":\n1}"}}},
		{"no space after the colon", "data:a\n\n", []sseEvent{{Data: "a"}}},
		{"only one space is dropped", "data:  a\n\n", []sseEvent{{Data: " a"}}},
		{"event and id fields", "event: error\nid: 7\nretry: 10\ndata: x\n\n", []sseEvent{{Event: "error", Data: "x"}}},
		{"event type resets after dispatch", "event: error\ndata: x\n\ndata: y\n\n", []sseEvent{{Event: "error", Data: "x"}, {Data: "y"}}},
		{"blank lines without data dispatch nothing", "\n\n\ndata: a\n\n", []sseEvent{{Data: "a"}}},
		{"last event without blank line", "data: a\n\ndata: [DONE]", []sseEvent{{Data: "a"}, {Data: "[DONE]"}}},
		{"empty data line", "data:\n\n", []sseEvent{{Data: ""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// One byte at a time: events split anywhere still parse.
			r := newSSEReader(iotest.OneByteReader(strings.NewReader(tt.in)))
			var got []sseEvent
			for {
				ev, err := r.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, ev)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("event %d = %q, want %q", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestSSEReaderHandlesLongLines(t *testing.T) {
	long := strings.Repeat("x", 200<<10)
	r := newSSEReader(strings.NewReader("data: " + long + "\n\n"))
	ev, err := r.Next()
	if err != nil || ev.Data != long {
		t.Fatalf("err %v, %d bytes", err, len(ev.Data))
	}
}

func TestSSEReaderRefusesAnEndlessEvent(t *testing.T) {
	r := newSSEReader(io.MultiReader(strings.NewReader("data: "), endless{}))
	if _, err := r.Next(); !errors.Is(err, errEventTooLarge) {
		t.Fatalf("err = %v", err)
	}
}

type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}
