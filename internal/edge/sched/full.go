package sched

import "time"

// FullBackoff is how long a provider its Node refused busy stays out of
// the picks unless the Node reports a slot free first (MarkFull).
const FullBackoff = 500 * time.Millisecond

// MarkFull records that c's Node refused work busy (quicwire.StreamBusy):
// every slot of c's provider is taken, by this Edge or another of the
// cluster (issue 22), whatever this Edge's own count says. Until the Node
// reports a slot free in a status update (Provider.in_use below its
// capacity), or for FullBackoff, no slot is granted on it: requests go to
// another candidate or wait in their queue, rather than retry a full Node
// in a loop. Call it before the refused slot is released, so that the
// release does not hand the same slot to the next waiter.
func (s *Scheduler) MarkFull(c Candidate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.full == nil {
		s.full = make(map[providerKey]time.Time)
	}
	k := c.key()
	s.full[k] = s.now().Add(FullBackoff)
	time.AfterFunc(FullBackoff, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.fullLocked(k) {
			return // marked again since
		}
		s.dispatchLocked()
	})
}

// fullLocked reports whether k is marked full now; an expired mark is
// dropped.
func (s *Scheduler) fullLocked(k providerKey) bool {
	until, ok := s.full[k]
	if !ok {
		return false
	}
	if !s.now().Before(until) {
		delete(s.full, k)
		return false
	}
	return true
}

// unmarkFullLocked drops the marks of providers whose Node now reports a
// slot free, or that are no longer candidates; refreshLocked calls it
// after each rebuild (a registry change: a status update among them).
func (s *Scheduler) unmarkFullLocked() {
	for k := range s.full {
		free := true
		for i := range s.cands {
			if c := &s.cands[i]; c.key() == k {
				free = c.InUse < c.Capacity
				break
			}
		}
		if free {
			delete(s.full, k)
		}
	}
}
