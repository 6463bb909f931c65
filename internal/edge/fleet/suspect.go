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
// the fence and its reason (R8, R9).
//
// Heard from again is not ready (issue 26): after a cut link heals, the
// Node's packets arrive again long before its data does (its QUIC sender
// may still be backing off the retransmissions of the cut, and packets
// that only acknowledge do not reset that backoff), so work sent then
// waits for nothing. A suspect generation heard from again (MarkHeard)
// stays suspect until a heartbeat the Edge sent at or after the suspicion
// is answered (Answered): that answer went out after the silence and came
// back, over the control stream, the same path a run's events take.

// MarkSuspect marks c suspect: it has been silent for silent. It does
// nothing for a fenced or already suspect generation. Callbacks registered
// with AfterSuspect run, each on its own goroutine.
//
// A generation still suspect since an earlier silence, heard from again
// but not yet answered, that falls silent again stays suspect from the
// first suspicion; it is silent since silent ago.
func (r *Registry) MarkSuspect(c *Conn, silent time.Duration) {
	r.mu.Lock()
	if c.state == Fenced {
		r.mu.Unlock()
		return
	}
	now := r.now()
	if !c.suspectSince.IsZero() {
		if !c.heardAt.IsZero() {
			c.heardAt, c.silentSince = time.Time{}, now.Add(-silent)
			r.notifyLocked()
		}
		r.mu.Unlock()
		return
	}
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

// MarkHeard records that suspect c's Node was heard from again at the
// transport level. c stays suspect: it reports whether c is suspect, and
// then the caller sends a heartbeat at once (transport.Heartbeat.ProbeNow)
// whose answer (Answered) ends the suspicion.
func (r *Registry) MarkHeard(c *Conn) (suspect bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.suspectSince.IsZero() || c.state == Fenced {
		return false
	}
	if c.heardAt.IsZero() {
		c.heardAt = r.now()
		r.notifyLocked()
	}
	return true
}

// Answered handles the answer to a heartbeat the Edge sent on c at sent.
// An answer to one sent at or after c became suspect proves the data path
// both ways after the silence and ends the suspicion: c is dispatchable
// again. It reports whether it ended one. An answer to an earlier
// heartbeat proves nothing about the path since, and changes nothing.
func (r *Registry) Answered(c *Conn, sent time.Time) (cleared bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.suspectSince.IsZero() || sent.Before(c.suspectSince) {
		return false
	}
	c.suspectSince, c.silentSince, c.heardAt = time.Time{}, time.Time{}, time.Time{}
	r.notifyLocked()
	return true
}

// ClearSuspect ends c's suspicion whatever proves it. The Edge's own
// connections end it with Answered; this is for callers that decide
// otherwise (tests of the scheduler).
func (r *Registry) ClearSuspect(c *Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.suspectSince.IsZero() {
		return
	}
	c.suspectSince, c.silentSince, c.heardAt = time.Time{}, time.Time{}, time.Time{}
	r.notifyLocked()
}

// Suspect reports whether c is suspect, and since when its Node has been
// silent.
func (c *Conn) Suspect() (silentSince time.Time, ok bool) {
	c.reg.mu.Lock()
	defer c.reg.mu.Unlock()
	return c.silentSince, !c.suspectSince.IsZero()
}

// HeardAgain reports when suspect c's Node was heard from again at the
// transport level; zero while it is silent, or not suspect. A suspect
// Node heard from again waits for a heartbeat answer.
func (c *Conn) HeardAgain() time.Time {
	c.reg.mu.Lock()
	defer c.reg.mu.Unlock()
	return c.heardAt
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
