package execution

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// psServer is an in-memory Ollama answering GET /api/ps (an
// http.RoundTripper, so that a synctest bubble holds it): it counts the
// reads and answers what is set.
type psServer struct {
	mu     sync.Mutex
	reads  int
	paths  []string
	status int
	body   string
}

func (s *psServer) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	s.paths = append(s.paths, r.URL.Path+" "+r.Header.Get("X-Static"))
	status := s.status
	if status == 0 {
		status = http.StatusOK
	}
	return &http.Response{StatusCode: status, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(s.body)), Request: r}, nil
}

func (s *psServer) set(status int, body string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status, s.body = status, body
}

func (s *psServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

// psBody is an /api/ps answer loading the models named, each of size
// 1000 (800 in VRAM), expiring at exp.
func psBody(exp time.Time, names ...string) string {
	var ms []string
	for _, n := range names {
		ms = append(ms, fmt.Sprintf(`{"name":%q,"model":%q,"size":1000,"size_vram":800,"expires_at":%q}`, n, n, exp.Format(time.RFC3339Nano)))
	}
	return `{"models":[` + strings.Join(ms, ",") + `]}`
}

// loadedProvider is a supervised provider whose plugin gives route (with
// loaded report report), its relay reaching srv; updates counts its
// status changes.
func loadedProvider(t *testing.T, report sdk.LoadedReport, srv *psServer, updates *int) *Provider {
	t.Helper()
	pl := newRoutePlugin("http://ollama.test:11434")
	pl.route.Loaded = report
	var mu sync.Mutex
	p := NewProvider(ProviderConfig{Name: "ollama", Adapter: "ollama", Targets: []string{"a", "b:7b"}, Capacity: 8, MaxLoaded: 2,
		Launch: func(context.Context) (Plugin, error) { return pl, nil }}, DefaultSupervision, discard(), func() {
		mu.Lock()
		*updates++
		mu.Unlock()
	})
	p.relay = &http.Client{Transport: srv}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Supervise(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

func loadedNames(w *wirepb.Provider) string {
	var out []string
	for _, m := range w.GetLoaded() {
		out = append(out, fmt.Sprintf("%s/%d", m.GetName(), m.GetInUse()))
	}
	return strings.Join(out, ",")
}

// Issue 23: an Ollama provider reports /api/ps, read along its route (its
// headers, not the plugin), with the sizes, expiry and max_loaded, and
// in_use as the Node's own calls on that model.
func TestLoadedModelsAreReadAlongTheRouteAndReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		exp := time.Now().Add(5 * time.Minute)
		srv := &psServer{body: psBody(exp, "a:latest", "b:7b")}
		var updates int
		p := loadedProvider(t, sdk.LoadedOllamaPS, srv, &updates)
		synctest.Wait()
		w := p.Wire()
		if !w.GetLoadedKnown() || w.GetAllLoaded() || w.GetMaxLoaded() != 2 || loadedNames(w) != "a:latest/0,b:7b/0" {
			t.Fatalf("reported %v", w)
		}
		if m := w.GetLoaded()[0]; m.GetSize() != 1000 || m.GetSizeVram() != 800 || m.GetExpiresUnixMs() != exp.UnixMilli() {
			t.Errorf("loaded model %v", m)
		}
		if srv.paths[0] != "/api/ps s" {
			t.Errorf("read %q, want /api/ps with the route's static header", srv.paths[0])
		}
		_, release, err := p.AcquireFor("a")
		if err != nil {
			t.Fatal(err)
		}
		if got := loadedNames(p.Wire()); got != "a:latest/1,b:7b/0" {
			t.Errorf("with a call on a: %s", got)
		}
		release()
		if got := loadedNames(p.Wire()); got != "a:latest/0,b:7b/0" {
			t.Errorf("after it: %s", got)
		}
	})
}

// Issue 23: the reads after calls end are bounded: a hundred calls ending
// at once make one read, or two when some ended while the first was made
// (the second after loadedMinInterval), never one per call; with no call,
// the next read is a relist interval later.
func TestLoadedReadsAfterCallsAreCoalescedAndRateBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &psServer{body: psBody(time.Now().Add(time.Hour), "a")}
		var updates int
		p := loadedProvider(t, sdk.LoadedOllamaPS, srv, &updates)
		synctest.Wait()
		base := srv.count()
		if base != 1 {
			t.Fatalf("%d reads at start, want 1", base)
		}
		time.Sleep(loadedMinInterval + time.Millisecond) // past the start read's pause
		for range 100 {
			_, release, err := p.AcquireFor("a")
			if err != nil {
				t.Fatal(err)
			}
			release()
		}
		// One read at once, and one after the pause if calls ended while it
		// was made; never more, however many ended.
		time.Sleep(loadedMinInterval)
		synctest.Wait()
		burst := srv.count() - base
		if burst < 1 || burst > 2 {
			t.Fatalf("%d reads after 100 calls ended, want 1 or 2", burst)
		}
		// The next read without a call: a relist interval after the pause
		// that follows the last one.
		time.Sleep(DefaultRelistInterval - 2*loadedMinInterval)
		synctest.Wait()
		if got := srv.count() - base; got != burst {
			t.Fatalf("%d reads before the relist interval, want %d", got, burst)
		}
		time.Sleep(4 * loadedMinInterval)
		synctest.Wait()
		if got := srv.count() - base; got != burst+1 {
			t.Fatalf("%d reads after the relist interval, want %d", got, burst+1)
		}
		// A steady stream of calls: at most one read per loadedMinInterval.
		start := srv.count()
		for range 40 {
			_, release, _ := p.AcquireFor("a")
			time.Sleep(25 * time.Millisecond)
			release()
		}
		if got := srv.count() - start; got > 5 {
			t.Errorf("%d reads in a second of calls, want at most 5", got)
		}
	})
}

// Issue 23: a model's expiry has the list read again just after it, so
// that its unload reaches the Edge; a failed read makes the list unknown,
// not stale.
func TestLoadedListFollowsExpiryAndFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &psServer{body: psBody(time.Now().Add(5*time.Second), "a")}
		var updates int
		p := loadedProvider(t, sdk.LoadedOllamaPS, srv, &updates)
		synctest.Wait()
		if got := loadedNames(p.Wire()); got != "a/0" {
			t.Fatalf("loaded %q", got)
		}
		srv.set(http.StatusOK, `{"models":[]}`)
		time.Sleep(5*time.Second + loadedExpirySlack)
		synctest.Wait()
		if w := p.Wire(); !w.GetLoadedKnown() || len(w.GetLoaded()) != 0 {
			t.Fatalf("after the expiry: %v", w)
		}
		srv.set(http.StatusInternalServerError, `{"error":"boom"}`)
		_, release, _ := p.AcquireFor("a")
		release()
		time.Sleep(loadedMinInterval)
		synctest.Wait()
		if w := p.Wire(); w.GetLoadedKnown() {
			t.Errorf("after a failed read the list is known: %v", w)
		}
	})
}

// Issue 23: a server that holds every model (the openai adapter's route)
// is reported all loaded and never read; a route without a report is not
// known.
func TestAllLoadedAndUnknownRoutesAreNotRead(t *testing.T) {
	for _, c := range []struct {
		report     sdk.LoadedReport
		known, all bool
	}{{sdk.LoadedAll, true, true}, {sdk.LoadedUnknown, false, false}} {
		t.Run(string(c.report), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &psServer{body: psBody(time.Now(), "a")}
				var updates int
				p := loadedProvider(t, c.report, srv, &updates)
				synctest.Wait()
				_, release, _ := p.AcquireFor("a")
				release()
				time.Sleep(time.Second)
				synctest.Wait()
				if w := p.Wire(); w.GetLoadedKnown() != c.known || w.GetAllLoaded() != c.all || len(w.GetLoaded()) != 0 {
					t.Errorf("reported %v", w)
				}
				if n := srv.count(); n != 0 {
					t.Errorf("%d reads of /api/ps", n)
				}
			})
		})
	}
}
