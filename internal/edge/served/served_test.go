package served

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

var (
	a1 = Offer{NodeID: "n1", Provider: "ollama", Adapter: "ollama", Target: "llama3:latest"}
	a2 = Offer{NodeID: "n2", Provider: "ollama", Adapter: "ollama", Target: "llama3:latest"}
	b1 = Offer{NodeID: "n1", Provider: "vllm", Adapter: "openai", Target: "qwen"}
)

// Issue 26: what one Edge process wrote, the next reads back as pending,
// in a file of mode 0600 written through a temporary (no .tmp left), and
// an unchanged set is not written again.
func TestMemoryRoundTripsThroughItsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	c := newClock()
	m := Open(Options{Path: path, Now: c.now})
	if p := m.Pending(); p != nil {
		t.Fatalf("a first start (no file) has pending %v", p)
	}
	if _, ok := m.Grace(); ok {
		t.Fatal("a first start with data_dir is in grace: a model nobody ever served would be 503")
	}
	m.Update([]Offer{b1, a2, a1, a1})
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*tmp*")); len(left) > 0 {
		t.Errorf("temporary files left beside the memory: %v", left)
	}
	before := fi.ModTime()
	os.Chtimes(path, before.Add(-time.Hour), before.Add(-time.Hour))
	m.Update([]Offer{a1, b1, a2})
	if fi, _ := os.Stat(path); !fi.ModTime().Equal(before.Add(-time.Hour)) {
		t.Error("an unchanged set was written again")
	}

	next := Open(Options{Path: path, Now: c.now})
	if got, want := next.Pending(), []Offer{a1, b1, a2}; !slices.Equal(got, want) {
		t.Errorf("pending after the restart %v, want %v", got, want)
	}
}

// Issue 26: a remembered offer is pending until its Node is back (what it
// offers then is the truth: a model it dropped is no longer pending), or
// until the window has passed, whichever is first; the file then forgets
// what did not come back.
func TestPendingEndsWhenTheNodeIsBackOrTheWindowHasPassed(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	c := newClock()
	Open(Options{Path: path, Now: c.now}).Update([]Offer{a1, a2, b1})

	m := Open(Options{Path: path, Now: c.now, Window: time.Minute})
	m.Update(nil) // the registry is empty at start: nothing is forgotten
	if got := m.Pending(); len(got) != 3 {
		t.Fatalf("pending at start %v", got)
	}
	m.Update([]Offer{a1}) // n1 is back, offering llama3 only: qwen is gone
	if got, want := m.Pending(), []Offer{a2}; !slices.Equal(got, want) {
		t.Errorf("pending with n1 back %v, want %v", got, want)
	}
	if got, want := Open(Options{Path: path, Now: c.now}).Pending(), []Offer{a1, a2}; !slices.Equal(got, want) {
		t.Errorf("a restart now would remember %v, want %v", got, want)
	}
	c.add(time.Minute)
	if got := m.Pending(); got != nil {
		t.Errorf("pending after the window %v", got)
	}
	m.Update([]Offer{a1})
	if got, want := Open(Options{Path: path, Now: c.now}).Pending(), []Offer{a1}; !slices.Equal(got, want) {
		t.Errorf("after the window the file still remembers %v, want %v", got, want)
	}
}

// Issue 26: without data_dir, or with a memory that cannot be read, the
// Edge is in its start-up grace for the window, and only then.
func TestGraceWithoutAMemory(t *testing.T) {
	bad := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(bad, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	wrongVersion := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(wrongVersion, []byte(`{"version":99,"offers":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{"no data_dir": "", "corrupt file": bad, "another version": wrongVersion} {
		c := newClock()
		m := Open(Options{Path: path, Now: c.now, Window: 10 * time.Second})
		c.add(9 * time.Second)
		if since, ok := m.Grace(); !ok || since != 9*time.Second {
			t.Errorf("%s: 9 s after start grace %v %v, want true 9s", name, since, ok)
		}
		c.add(time.Second)
		if _, ok := m.Grace(); ok {
			t.Errorf("%s: still in grace after the window", name)
		}
	}
	// The corrupt file is replaced at the next change.
	m := Open(Options{Path: bad, Now: newClock().now})
	m.Update([]Offer{a1})
	if got := Open(Options{Path: bad}).Pending(); !slices.Equal(got, []Offer{a1}) {
		t.Errorf("a corrupt memory was not replaced: %v", got)
	}
}

// The default window is the heartbeat's: suspicion, the response wait
// and a few reconnects.
func TestDefaultWindow(t *testing.T) {
	c := newClock()
	m := Open(Options{Now: c.now})
	c.add(60 * time.Second)
	if _, ok := m.Grace(); !ok {
		t.Error("grace over after 60 s")
	}
	c.add(time.Second)
	if _, ok := m.Grace(); ok {
		t.Error("grace not over after 61 s")
	}
}

// fakeSource is a registry whose offers the test sets.
type fakeSource struct {
	mu      sync.Mutex
	offers  []Offer
	changed chan struct{}
}

func (s *fakeSource) Changed() <-chan struct{} { s.mu.Lock(); defer s.mu.Unlock(); return s.changed }

func (s *fakeSource) Offers(match func(nodeID, provider, adapter, target string) bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.offers {
		if match(o.NodeID, o.Provider, o.Adapter, o.Target) {
			return true
		}
	}
	return false
}

func (s *fakeSource) set(offers ...Offer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.offers = offers
	close(s.changed)
	s.changed = make(chan struct{})
}

// Run follows the registry's changes, and forgets at the window's end
// what did not come back, with no change to wake it.
func TestRunFollowsTheRegistryAndTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), FileName)
		Open(Options{Path: path}).Update([]Offer{a1, a2})
		m := Open(Options{Path: path, Window: 30 * time.Second})
		src := &fakeSource{changed: make(chan struct{})}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); m.Run(ctx, src) }()

		src.set(a1)
		synctest.Wait()
		if got := m.Pending(); !slices.Equal(got, []Offer{a2}) {
			t.Errorf("pending with n1 back %v, want [n2's]", got)
		}
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if got := Open(Options{Path: path}).Pending(); !slices.Equal(got, []Offer{a1}) {
			t.Errorf("after the window the file remembers %v, want only what is offered", got)
		}
		cancel()
		<-done
	})
}

// A Node that has registered but not completed its ready handshake is not
// back yet: its remembered models stay "retry" rather than turning into
// "no candidate" for the moment in between (issue 26).
func TestARegisteredNodeIsBackOnlyWhenReady(t *testing.T) {
	m := Open(Options{Path: ""})
	m.pending = []Offer{{NodeID: "n1", Target: "m"}}
	m.update([]Offer{{NodeID: "n1", Target: "m"}}, func(string) bool { return false })
	if got := m.Pending(); len(got) != 1 {
		t.Fatalf("n1 registered, not ready: pending %v, want m still pending", got)
	}
	m.update([]Offer{{NodeID: "n1", Target: "m"}}, func(id string) bool { return id == "n1" })
	if got := m.Pending(); len(got) != 0 {
		t.Errorf("n1 ready: pending %v, want none", got)
	}
}
