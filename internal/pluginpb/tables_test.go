package pluginpb

import (
	"net/http"
	"strings"
	"testing"
)

// Headers cross in a stable order (sorted names, values in their order)
// and come back as they were.
func TestHeadersToWireIsStableAndRoundTrips(t *testing.T) {
	h := http.Header{"B": {"2", "3"}, "A": {"1"}}
	var got []string
	for _, kv := range HeadersToWire(h) {
		got = append(got, kv.GetName()+"="+kv.GetValue())
	}
	if strings.Join(got, ",") != "A=1,B=2,B=3" {
		t.Errorf("headers %v", got)
	}
	back := HeadersFromWire(HeadersToWire(h))
	if back.Get("A") != "1" || strings.Join(back.Values("B"), ",") != "2,3" || len(back) != 2 {
		t.Errorf("round trip %v", back)
	}
	if HeadersFromWire(nil) == nil {
		t.Error("no headers came back as a nil header")
	}
}
