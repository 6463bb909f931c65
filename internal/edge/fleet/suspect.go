package fleet

import (
	"time"
)

// Suspicion (P4): a generation whose Node has not been heard from at the
// transport level for quicwire.Liveness.SuspectAfter is suspect. It keeps
// its state (ready, draining) and its connection, but gets no new work: it
// drops out of Ready and Dispatchable, so the scheduler's candidates and
// queues are re-evaluated at once, and work that is waiting for its first
// event on it may move elsewhere (AfterSuspect). The heartbeat still decides
// the fence and its reason (R8, R9). A suspect Node heard from again is
// dispatchable again at once.

// MarkSuspect marks c suspect: it has been silent for silent. It does
// nothing for a fenced or already suspect generation. Callbacks registered
// with AfterSuspect run, each on its own goroutine.
func (r *Registry) MarkSuspect(c *Conn, silent time.Duration) {
	r.mu.Lock()
	if c.state == Fenced || !c.suspectSince.IsZero() {
		r.mu.Unlock()
		return
	}
	now := r.now()
	c.suspectSince = now
	c.silentSince = now.Add(-silent)
	fs := make([]func(), 0, len(c.onSuspect))
	for _, f := range c.onSuspect {
		fs = append(fs, f)
	}
	clear(c.onSuspect)
	r.notifyLocked()
	r.mu.Unlock()
	for _, f := range fs {
		go f()
	}
}

// ClearSuspect ends c's suspicion: it was heard from again.
func (r *Registry) ClearSuspect(c *Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.suspectSince.IsZero() {
		return
	}
	c.suspectSince, c.silentSince = time.Time{}, time.Time{}
	r.notifyLocked()
}

// Suspect reports whether c is suspect, and since when its Node has been
// silent.
func (c *Conn) Suspect() (silentSince time.Time, ok bool) {
	c.reg.mu.Lock()
	defer c.reg.mu.Unlock()
	return c.silentSince, !c.suspectSince.IsZero()
}

// AfterSuspect arranges for f to run on its own goroutine when c becomes
// suspect, or at once if it is suspect now. Like context.AfterFunc, the
// returned stop cancels the arrangement and reports whether it did so
// before f was started. Each f runs at most once.
func (c *Conn) AfterSuspect(f func()) (stop func() bool) {
	r := c.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	if !c.suspectSince.IsZero() {
		go f()
		return func() bool { return false }
	}
	if c.onSuspect == nil {
		c.onSuspect = make(map[uint64]func())
	}
	r.seq++
	id := r.seq
	c.onSuspect[id] = f
	return func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		_, waiting := c.onSuspect[id]
		delete(c.onSuspect, id)
		return waiting
	}
}
