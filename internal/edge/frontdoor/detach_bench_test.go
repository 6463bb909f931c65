package frontdoor

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// One keep-alive client's requests one after another, each detached and
// answered by its own goroutine, as the Edge answers a tunnel: per request,
// the client's write, the poller's wake-up for the parked connection, its
// hand-off to the server's Accept, net/http's read of the request, the
// detach and the answer (issue 25: the first byte of a sparse stream pays
// this path at every request). "net/http" is the same client served by
// net/http whole, for comparison.
//
//	go test -run '^$' -bench DetachedKeepAlive ./internal/edge/frontdoor
func BenchmarkDetachedKeepAlive(b *testing.B) {
	s := startDetachServer(b, Limits{})
	go func() {
		for dt := range s.detached {
			go func() {
				_, _ = io.WriteString(dt, "ok")
				dt.Finish()
			}()
		}
	}()
	b.Run("detached", func(b *testing.B) {
		c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
		defer c.CloseIdleConnections()
		for b.Loop() {
			resp, err := c.Post("http://"+s.addr+"/detach", "text/plain", strings.NewReader("hi"))
			if err != nil {
				b.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(body) != "ok" {
				b.Fatalf("answer %q, %v", body, err)
			}
		}
	})
	b.Run("net/http", func(b *testing.B) {
		c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
		defer c.CloseIdleConnections()
		for b.Loop() {
			resp, err := c.Get("http://" + s.addr + "/plain")
			if err != nil {
				b.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !strings.HasPrefix(string(body), "plain from ") {
				b.Fatalf("answer %q, %v", body, err)
			}
		}
	})
}
