package lease

import (
	"container/heap"
	"time"
)

// replayCache holds the ids of opened leases until they can no longer be
// opened anyway (their expiry plus the skew), with a bound on how many.
// Not safe for concurrent use: Opener.mu guards it.
type replayCache struct {
	max   int
	ids   map[string]struct{}
	queue deadlineHeap // the same ids, soonest forgettable first
}

func newReplayCache(maxIDs int) *replayCache {
	return &replayCache{max: maxIDs, ids: make(map[string]struct{})}
}

// forget drops every id whose deadline is before now. Open has already
// refused, as expired, every lease with such a deadline, so none of them
// can be replayed once forgotten.
func (c *replayCache) forget(now time.Time) {
	for len(c.queue) > 0 && c.queue[0].deadline.Before(now) {
		e := heap.Pop(&c.queue).(entry)
		delete(c.ids, e.id)
	}
}

func (c *replayCache) has(id string) bool {
	_, ok := c.ids[id]
	return ok
}

// full reports whether another id would exceed the bound. The cache never
// evicts a live id to make room: that id could then be replayed.
func (c *replayCache) full() bool { return len(c.ids) >= c.max }

func (c *replayCache) add(id string, deadline time.Time) {
	c.ids[id] = struct{}{}
	heap.Push(&c.queue, entry{id: id, deadline: deadline})
}

func (c *replayCache) len() int { return len(c.ids) }

type entry struct {
	id       string
	deadline time.Time
}

type deadlineHeap []entry

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h deadlineHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *deadlineHeap) Push(x any)        { *h = append(*h, x.(entry)) }
func (h *deadlineHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = entry{}
	*h = old[:len(old)-1]
	return e
}
