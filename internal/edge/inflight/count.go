package inflight

// Live is how many pieces of work are in flight now: what a stopping Edge
// waits for (issue 22).
func (t *Tracker) Live() int {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.live)
}
