package nodeserver

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/internal/edge/fleet"
)

// renewLater refuses every renewal as too soon, the way the registrar's
// per-Node rate limit does (issue 24, gap 7).
type renewLater struct {
	Enrollment
	retryAt time.Time
}

type tooSoon struct{ at time.Time }

func (e tooSoon) Error() string        { return fmt.Sprintf("renewed too soon; retry at %s", e.at) }
func (e tooSoon) RetryTime() time.Time { return e.at }

func (r renewLater) Renews() bool { return true }
func (r renewLater) Renew(string, []byte) ([][]byte, error) {
	return nil, tooSoon{r.retryAt}
}
func (r renewLater) ServeJoin(context.Context, *quic.Conn) {}
func (r renewLater) Admit(string, *x509.Certificate) error { return nil }

// A renewal refused as too soon tells the Node when to ask again, so that
// it waits instead of asking on its own schedule; the refusals of a Node
// that keeps asking are logged once a minute, not each time.
func TestARenewalRefusedAsTooSoonSaysWhenToRetry(t *testing.T) {
	reg := fleet.New(fleet.Options{})
	gen := reg.Register(fleet.ConnInfo{NodeID: "n1"})
	var logged countHandler
	c := &nodeConn{srv: &Server{opts: Options{Enrollment: renewLater{retryAt: time.Now().Add(10 * time.Minute)}}},
		gen: gen, log: slog.New(&logged)}
	resp := c.renew([]byte("csr"))
	if resp.GetRefusal() == "" || len(resp.GetChain()) != 0 {
		t.Fatalf("answer %v, want a refusal", resp)
	}
	if got := time.Duration(resp.GetRetryAfterMs()) * time.Millisecond; got < 9*time.Minute || got > 10*time.Minute {
		t.Errorf("retry_after %s, want about 10m", got)
	}
	for range 100 {
		c.renew([]byte("csr"))
	}
	if logged.n != 1 {
		t.Errorf("%d log lines for 101 refusals in a moment, want 1", logged.n)
	}
}

func TestLogEveryLetsOneLineAMinuteThrough(t *testing.T) {
	var l logEvery
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, ok := l.Allow(t0); !ok {
		t.Fatal("the first line held back")
	}
	for i := range 5 {
		if _, ok := l.Allow(t0.Add(time.Duration(i+1) * time.Second)); ok {
			t.Fatal("a second line within the minute")
		}
	}
	if n, ok := l.Allow(t0.Add(time.Minute)); !ok || n != 5 {
		t.Errorf("after a minute: allowed %t, held back %d, want true, 5", ok, n)
	}
}

type countHandler struct{ n int }

func (h *countHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (h *countHandler) Handle(context.Context, slog.Record) error { h.n++; return nil }
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler        { return h }
func (h *countHandler) WithGroup(string) slog.Handler             { return h }
