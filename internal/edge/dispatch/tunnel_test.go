package dispatch

import (
	"testing"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// TestContentLengthIsTheBodySent (R3): the body of an attempt may differ
// from the client's (an alias route's target in it), so its length
// replaces whatever the request said, in any spelling, once.
func TestContentLengthIsTheBodySent(t *testing.T) {
	r := &wirepb.TunnelRequest{Headers: []*wirepb.Header{
		{Name: "content-length", Value: "999"}, {Name: "Content-Type", Value: "application/json"},
		{Name: "Content-Length", Value: "5"}, {Name: "User-Agent", Value: "ollama/0.17.4"},
	}}
	setContentLength(r, 42)
	var got []string
	for _, h := range r.GetHeaders() {
		got = append(got, h.GetName()+": "+h.GetValue())
	}
	want := []string{"Content-Type: application/json", "User-Agent: ollama/0.17.4", "Content-Length: 42"}
	if len(got) != len(want) {
		t.Fatalf("headers %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("headers %q, want %q", got, want)
			break
		}
	}
}
