// Package sched decides where on the Edge a request runs. It lists the
// candidates (online provider targets on ready, current Node generations,
// R1), counts its own slots against each provider's reported capacity,
// picks among those with a slot free the one where the work is cheapest
// (the session's last place, the model already loaded: warm.go writes
// down the order) and then the largest share of its capacity free, and
// admits a request that finds every slot busy into a FIFO queue per model,
// bounded by a depth and a queue timeout (S5). Queued work is re-evaluated
// whenever a slot frees and whenever the registry changes: a Node
// connects, is fenced or reports new capacity (R9).
//
// One mutex guards everything. The invariant it protects: whenever the
// lock is released, no waiting request can use a free slot, because every
// change that frees or adds capacity (a Release, a refreshed candidate
// list) is followed by a dispatch pass over the waiters in arrival order.
// So a new request that finds a free slot overtakes no one, and a waiter
// is only ever passed by a later one for a slot it could not use (another
// Match or Exclude).
package sched

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/edge/fleet"
)

// Options tune a Scheduler.
type Options struct {
	// Now reads the clock for queue positions and waits; nil: time.Now.
	// Queue timeouts use the time package's timers.
	Now func() time.Time
}

// Request is what Acquire places.
type Request struct {
	// ID names the request (run or tunnel id) in the admin view.
	ID string
	// Model is what the client asked for; it is also the queue key.
	Model string
	// Match filters candidates (a route's targets, an adapter). nil: the
	// target is Model, or Model with Ollama's implicit ":latest" tag.
	Match func(c Candidate) bool
	// Exclude lists candidates already tried (failover); a candidate is
	// excluded when its NodeID, Generation and Provider match one here.
	Exclude []Candidate
	// QueueTimeout is how long to wait for a slot; 0: do not wait.
	QueueTimeout time.Duration
	// MaxQueueDepth is how many requests for Model may wait at once;
	// when that many already wait (or it is 0), a busy request is refused
	// with queue_full.
	MaxQueueDepth int
	// Prefer, if not nil, is where the request would rather run: the
	// candidate (by Node, provider and target, in any generation of the
	// Node) that ran the last turn of its session, whose model server
	// holds the session's prompt in its cache. It is picked while it has a
	// free slot and its share of capacity in use is at most PreferSlack
	// above the least busy candidate's (bounded load: one hot session
	// cannot pin a Node); otherwise the least busy is, as without it.
	Prefer *Candidate
	// PreferSlack is how much busier, as a fraction of capacity, the
	// preferred candidate may be than the least busy one.
	PreferSlack float64
	// WarmFirst routes the request warm first (warm.go): to a candidate
	// whose server holds its model loaded, then to one with room to load
	// it, within bounded load. Without it the tiers are not used (the
	// slot's Choice still says which one the pick was).
	WarmFirst bool
}

// Scheduler hands out slots on candidates. It is safe for concurrent use.
type Scheduler struct {
	reg *fleet.Registry
	now func() time.Time

	mu       sync.Mutex
	changed  <-chan struct{} // closed when cands is stale
	cands    []candidate     // sorted by node, provider, target
	inflight map[providerKey]int
	// connSlots counts the slots held on each Node generation, against
	// its stream limit (fleet.Conn.Slots).
	connSlots map[connKey]int
	models    map[string]*modelCount // present while a model waits or runs
	waiting   []*waiter              // every model's waiters, in arrival order
	// full marks providers their Node refused busy, until when (full.go).
	full map[providerKey]time.Time
	// byTarget counts this Edge's slots on each provider by target:
	// what it has loaded or is loading there (warm.go).
	byTarget map[providerKey]map[string]int
	elig     []eligible // pickLocked's scratch
	tied     []int      // bestLocked's scratch
	rr       uint64     // turns among tied candidates
}

type modelCount struct{ waiting, inflight int }

// waiter is a queued request. Its caller blocks on granted; the slot is
// set under s.mu before granted is closed.
type waiter struct {
	req     Request
	since   time.Time
	granted chan struct{}
	slot    *Slot
}

// New returns a scheduler over reg's Nodes. Run must run for queued
// requests to see registry changes.
func New(reg *fleet.Registry, opts Options) *Scheduler {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	stale := make(chan struct{})
	close(stale)
	return &Scheduler{
		reg:       reg,
		now:       opts.Now,
		changed:   stale,
		inflight:  make(map[providerKey]int),
		connSlots: make(map[connKey]int),
		models:    make(map[string]*modelCount),
		byTarget:  make(map[providerKey]map[string]int),
	}
}

// Run re-evaluates the queues at every registry change (R9) until ctx is
// done.
func (s *Scheduler) Run(ctx context.Context) {
	for {
		s.mu.Lock()
		s.reevaluateLocked()
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// Slot is the right to run one request on Candidate. Release it when the
// request ends.
type Slot struct {
	// Candidate is where the request runs.
	Candidate Candidate
	// Waited is how long the request waited in the queue.
	Waited time.Duration

	s        *Scheduler
	conn     *fleet.Conn
	model    string
	released bool // guarded by s.mu
}

// Conn is the Node generation the slot is on. If it is fenced before the
// request is dispatched, the dispatch fails and the caller moves on with
// the candidate in Request.Exclude.
func (sl *Slot) Conn() *fleet.Conn { return sl.conn }

// Release frees the slot and grants it to the first waiter that can use
// it. It is idempotent.
func (sl *Slot) Release() {
	s := sl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl.released {
		return
	}
	sl.released = true
	k := sl.Candidate.key()
	if s.inflight[k]--; s.inflight[k] <= 0 {
		delete(s.inflight, k)
	}
	if t := s.byTarget[k]; t[sl.Candidate.Target] <= 1 {
		delete(t, sl.Candidate.Target)
		if len(t) == 0 {
			delete(s.byTarget, k)
		}
	} else {
		t[sl.Candidate.Target]--
	}
	if ck := k.conn(); s.connSlots[ck] <= 1 {
		delete(s.connSlots, ck)
	} else {
		s.connSlots[ck]--
	}
	m := s.models[sl.model]
	m.inflight--
	s.forgetIdleLocked(sl.model)
	s.refreshLocked()
	s.dispatchLocked()
}

// Acquire returns a slot on the best candidate with free capacity, or
// waits for one in the model's FIFO queue until a slot frees or the
// registry changes in the request's favour. It fails at once with
// ErrNoCandidate when no ready Node offers the model, at once with
// ErrQueueFull when every slot is busy and the request may not wait, with
// ErrQueueTimeout after r.QueueTimeout, and with ctx's error when ctx ends
// first. While queued, a request keeps its place even if every candidate
// goes away: the Node may come back before the timeout.
func (s *Scheduler) Acquire(ctx context.Context, r Request) (*Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sched: acquire for %q: %w", r.Model, err)
	}
	s.mu.Lock()
	s.reevaluateLocked() // earlier waiters first: they may use a new Node
	if !s.anyCandidateLocked(&r) {
		s.mu.Unlock()
		return nil, &RefusalError{Reason: ReasonNoCandidate, Model: r.Model, Detail: "no ready node offers it"}
	}
	depth := 0
	if m := s.models[r.Model]; m != nil {
		depth = m.waiting
	}
	mayWait := r.QueueTimeout > 0 && depth < r.MaxQueueDepth
	waited := time.Duration(0)
	if !mayWait {
		waited = ColdWait // no queue to wait in for a warm slot (warm.go)
	}
	if c, ok := s.pickLocked(&r, waited); ok {
		slot := s.grantLocked(c, r.Model, 0)
		s.mu.Unlock()
		return slot, nil
	}
	if !mayWait {
		s.mu.Unlock()
		detail := fmt.Sprintf("every slot is busy and %d requests wait", depth)
		if r.QueueTimeout <= 0 || r.MaxQueueDepth <= 0 {
			detail = "every slot is busy and the request may not wait"
		}
		return nil, &RefusalError{Reason: ReasonQueueFull, Model: r.Model, RetryAfter: retryAfter, Detail: detail}
	}
	w := &waiter{req: r, since: s.now(), granted: make(chan struct{})}
	s.waiting = append(s.waiting, w)
	s.modelLocked(r.Model).waiting++
	s.mu.Unlock()

	timer := time.NewTimer(r.QueueTimeout)
	defer timer.Stop()
	if r.WarmFirst {
		// A waiter held for a warm slot may take a cold one after
		// ColdWait (warm.go): look again then, event or not.
		cold := time.AfterFunc(ColdWait, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.dispatchLocked()
		})
		defer cold.Stop()
	}
	select {
	case <-w.granted:
		if ctx.Err() != nil { // the caller left as the grant came: pass it on
			w.slot.Release()
			return nil, fmt.Errorf("sched: queued for %q: %w", r.Model, ctx.Err())
		}
		return w.slot, nil
	case <-timer.C:
		s.mu.Lock()
		defer s.mu.Unlock()
		if w.slot != nil { // granted at the same instant: take it
			return w.slot, nil
		}
		s.dequeueLocked(w)
		return nil, &RefusalError{Reason: ReasonQueueTimeout, Model: r.Model, RetryAfter: retryAfter,
			Detail: fmt.Sprintf("no slot within %s", r.QueueTimeout)}
	case <-ctx.Done():
		s.mu.Lock()
		slot := w.slot
		if slot == nil {
			s.dequeueLocked(w)
		}
		s.mu.Unlock()
		if slot != nil { // granted as the caller left: pass it on
			slot.Release()
		}
		return nil, fmt.Errorf("sched: queued for %q: %w", r.Model, ctx.Err())
	}
}

// reevaluateLocked refreshes the candidates if the registry changed and
// then lets the waiters take what became free.
func (s *Scheduler) reevaluateLocked() {
	if s.refreshLocked() {
		s.dispatchLocked()
	}
}

// dispatchLocked grants free slots to waiters in arrival order: each
// waiter, oldest first, takes the best free candidate it can use. The
// oldest waiters of every model go first, so capacity shared between
// models is shared fairly too.
func (s *Scheduler) dispatchLocked() {
	if len(s.waiting) == 0 {
		return
	}
	now := s.now()
	kept := s.waiting[:0]
	for _, w := range s.waiting {
		c, ok := s.pickLocked(&w.req, now.Sub(w.since))
		if !ok {
			kept = append(kept, w)
			continue
		}
		s.models[w.req.Model].waiting--
		w.slot = s.grantLocked(c, w.req.Model, now.Sub(w.since))
		close(w.granted)
	}
	clear(s.waiting[len(kept):])
	s.waiting = kept
}

// grantLocked counts a slot on c for model.
func (s *Scheduler) grantLocked(c candidate, model string, waited time.Duration) *Slot {
	k := c.key()
	s.inflight[k]++
	s.connSlots[k.conn()]++
	if s.byTarget[k] == nil {
		s.byTarget[k] = make(map[string]int)
	}
	s.byTarget[k][c.Target]++
	s.modelLocked(model).inflight++
	return &Slot{Candidate: c.Candidate, Waited: waited, s: s, conn: c.conn, model: model}
}

// dequeueLocked removes an ungranted waiter (timed out or cancelled).
func (s *Scheduler) dequeueLocked(w *waiter) {
	if i := slices.Index(s.waiting, w); i >= 0 {
		s.waiting = slices.Delete(s.waiting, i, i+1)
		s.models[w.req.Model].waiting--
		s.forgetIdleLocked(w.req.Model)
	}
}

func (s *Scheduler) modelLocked(model string) *modelCount {
	m := s.models[model]
	if m == nil {
		m = new(modelCount)
		s.models[model] = m
	}
	return m
}

func (s *Scheduler) forgetIdleLocked(model string) {
	if m := s.models[model]; m != nil && m.waiting == 0 && m.inflight == 0 {
		delete(s.models, model)
	}
}
