// Package served is the Edge's memory of what its Nodes served: every
// target each Node's providers offered. It is kept in a small file in
// data_dir, rewritten whenever that set changes, and read at start, so
// that for a while after a restart a model that was served before is
// answered "known, its Nodes are reconnecting: retry" (503 with
// Retry-After) rather than "no such model" (404): the answer that makes
// an SDK or the ollama CLI try again instead of raising not-found or
// offering to pull the model.
//
// A remembered offer stays pending until its Node has registered again
// and reported its providers (then what the Node offers now is the
// truth), or until Window has passed since the start, whichever comes
// first. Without a file to read (no data_dir, or one unreadable), the
// Edge knows nothing of what it served: for Window after the start, every
// model nobody offers yet is answered "the Edge started N s ago; its Nodes
// are reconnecting" (Grace) instead of 404.
package served

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/edge/datadir"
	"github.com/iop-dev/iop/quicwire"
)

// FileName is the memory's file in data_dir.
const FileName = "served.json"

// fileVersion is the version of the file's shape; a file of another
// version is not read (the Edge falls back to Grace).
const fileVersion = 1

// Offer is one target one provider of one Node offered.
type Offer struct {
	NodeID   string `json:"node"`
	Provider string `json:"provider"`
	Adapter  string `json:"adapter"`
	Target   string `json:"target"`
}

func compareOffers(a, b Offer) int {
	return strings.Compare(a.NodeID+"\x00"+a.Provider+"\x00"+a.Adapter+"\x00"+a.Target,
		b.NodeID+"\x00"+b.Provider+"\x00"+b.Adapter+"\x00"+b.Target)
}

// file is the file's shape.
type file struct {
	Version int     `json:"version"`
	Offers  []Offer `json:"offers"`
}

// Source is what the memory watches (*fleet.Registry).
type Source interface {
	// Changed is closed at the next change of any Node's state or
	// providers.
	Changed() <-chan struct{}
	// Offers calls match for every target of every provider of every Node
	// held, in any state, until match returns true.
	Offers(match func(nodeID, provider, adapter, target string) bool) bool
}

// Options configure a Memory.
type Options struct {
	// Path is the memory's file (data_dir/served.json); "": the Edge has
	// no data_dir and remembers nothing across a restart (Grace).
	Path string
	// Window is how long after the start Nodes are expected back;
	// WindowFor(quicwire.DefaultLiveness), 61 s, when zero.
	Window time.Duration
	// Now is the clock; nil: time.Now.
	Now func() time.Time
	// Logger logs a file that cannot be read or written; nil logs
	// nothing.
	Logger *slog.Logger
}

// reconnectSlack is what WindowFor allows a Node, once it has given up on
// the old Edge, to dial and register with the new one: a few reconnect
// attempts at the Node's backoff.
const reconnectSlack = 10 * time.Second

// WindowFor is how long after a start the Nodes of an Edge with liveness
// l are expected back: the longest a Node that was connected takes to
// give up on the old Edge process (silence for SuspectAfter, then its
// heartbeat unanswered for ResponseWait: had the Edge stayed up, it would
// have fenced the Node by then), and a few reconnect attempts. 61 s in
// the default profile. A Node usually notices a restart within a second
// (the new process's stateless reset), so the window is a bound, not a
// wait: a model is pending only until its Nodes have registered again.
func WindowFor(l quicwire.Liveness) time.Duration {
	return l.SuspectAfter() + l.ResponseWait + reconnectSlack
}

// Memory is what the Edge served before it started, and what it serves
// now. It is safe for concurrent use.
type Memory struct {
	path     string
	now      func() time.Time
	log      *slog.Logger
	started  time.Time
	deadline time.Time
	// grace: there was nothing to read (no path, or a file that could not
	// be read): every unknown model is pending until deadline.
	grace bool

	mu      sync.Mutex
	pending []Offer // remembered, whose Node is not back yet; nil after deadline
	written []Offer // pending ∪ offered, as last written (or read)
}

// Open reads the memory at opts.Path, if any. A missing file is an empty
// memory (a first start: nothing was served before, so nothing is
// pending, and no grace either); a file that cannot be read, is not the
// Edge's own (datadir.Check) or is not valid is logged and set aside:
// the Edge starts with Grace, as without data_dir. Open never fails: the
// memory only softens answers, it must not keep the Edge from starting.
func Open(opts Options) *Memory {
	if opts.Window <= 0 {
		opts.Window = WindowFor(quicwire.DefaultLiveness)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Memory{path: opts.Path, now: opts.Now, log: opts.Logger}
	m.started = m.now()
	m.deadline = m.started.Add(opts.Window)
	if m.path == "" {
		m.grace = true
		return m
	}
	offers, err := read(m.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		m.log.Warn("the Edge's memory of the models it served cannot be read; for the start-up grace every unknown model is answered 503, not 404",
			"path", m.path, "err", err, "fix", "it is rewritten at the next change of the Nodes' models; delete it to silence this")
		m.grace = true
	default:
		m.pending, m.written = offers, offers
	}
	return m
}

// read reads the offers in path.
func read(path string) ([]Offer, error) {
	if _, err := os.Lstat(path); err != nil {
		return nil, err
	}
	if err := datadir.Check(filepath.Dir(path), filepath.Base(path)); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if f.Version != fileVersion {
		return nil, fmt.Errorf("%s: version %d, this Edge reads version %d", path, f.Version, fileVersion)
	}
	slices.SortFunc(f.Offers, compareOffers)
	return slices.CompactFunc(f.Offers, func(a, b Offer) bool { return a == b }), nil
}

// Until is when the window ends: nothing is pending after it, and the
// grace is over.
func (m *Memory) Until() time.Time { return m.deadline }

// Since is how long ago the memory was opened: the Edge's start.
func (m *Memory) Since() time.Duration { return m.now().Sub(m.started) }

// Pending lists the offers remembered from before the start whose Node
// has not registered again, while Window has not passed; nil otherwise.
func (m *Memory) Pending() []Offer {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.now().Before(m.deadline) {
		return nil
	}
	return slices.Clone(m.pending)
}

// Grace reports whether the Edge remembers nothing of what it served and
// Window has not passed since the start, and how long ago it started:
// then a model nobody offers may still be one whose Nodes are on their
// way back.
func (m *Memory) Grace() (since time.Duration, ok bool) {
	now := m.now()
	return now.Sub(m.started), m.grace && now.Before(m.deadline)
}

// Update records what the Nodes offer now: a remembered offer of a Node
// that offers anything again is no longer pending (what it offers now is
// the truth), and after Window none is. When the set to remember (pending
// and offered) changed, it is written to the file.
func (m *Memory) Update(offered []Offer) { m.update(offered, nil) }

// NodeReadiness is what a Source may also tell: whether a Node has
// completed its ready handshake (*fleet.Registry does). A remembered model
// of a Node that has registered but is not ready yet stays pending: its
// requests are still told to retry, not "no candidate".
type NodeReadiness interface {
	NodeReady(nodeID string) bool
}

// update is Update, counting a Node back only when ready says so (nil:
// as soon as it offers anything).
func (m *Memory) update(offered []Offer, ready func(nodeID string) bool) {
	offered = slices.Clone(offered)
	slices.SortFunc(offered, compareOffers)
	offered = slices.CompactFunc(offered, func(a, b Offer) bool { return a == b })
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.now().Before(m.deadline) {
		m.pending = nil
	}
	back := map[string]bool{}
	for _, o := range offered {
		if _, seen := back[o.NodeID]; !seen {
			back[o.NodeID] = ready == nil || ready(o.NodeID)
		}
	}
	m.pending = slices.DeleteFunc(m.pending, func(o Offer) bool { return back[o.NodeID] })
	all := append(slices.Clone(m.pending), offered...)
	slices.SortFunc(all, compareOffers)
	all = slices.CompactFunc(all, func(a, b Offer) bool { return a == b })
	if m.path == "" || slices.Equal(all, m.written) {
		return
	}
	if err := write(m.path, all); err != nil {
		// The next change tries again; until then a restart remembers the
		// last set written.
		m.log.Warn("the Edge's memory of the models it served cannot be written; after a restart, models it served may be answered 404 until their Nodes are back",
			"path", m.path, "err", err, "fix", "make data_dir writable by the Edge's user")
		return
	}
	m.written = all
}

// write writes offers to path, atomically, with the data_dir file mode.
func write(path string, offers []Offer) error {
	if offers == nil {
		offers = []Offer{}
	}
	b, err := json.MarshalIndent(file{Version: fileVersion, Offers: offers}, "", "  ")
	if err != nil {
		return err
	}
	return datadir.WriteFile(path, append(b, '\n'))
}

// Offered lists every target src's Nodes offer now.
func Offered(src Source) []Offer {
	var out []Offer
	src.Offers(func(nodeID, provider, adapter, target string) bool {
		out = append(out, Offer{NodeID: nodeID, Provider: provider, Adapter: adapter, Target: target})
		return false
	})
	return out
}

// Run keeps the memory up to date with src until ctx is done: at every
// change, and once when Window passes (so that the file forgets what did
// not come back).
func (m *Memory) Run(ctx context.Context, src Source) {
	expire := time.NewTimer(m.deadline.Sub(m.now()))
	defer expire.Stop()
	for {
		changed := src.Changed()
		var ready func(string) bool
		if r, ok := src.(NodeReadiness); ok {
			ready = r.NodeReady
		}
		m.update(Offered(src), ready)
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-expire.C:
		}
	}
}
