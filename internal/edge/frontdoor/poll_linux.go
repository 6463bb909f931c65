package frontdoor

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	"github.com/iop-dev/iop/internal/netpeek"
)

// connPoller watches the connections of detached requests (detach.go) for
// their client's next bytes or end, all of them from one goroutine: a
// waiting request, and an idle connection after its answer, cost the Edge
// a map entry here, not a goroutine blocked in a read (issue 25).
//
// It is an epoll set of its own beside the Go runtime's: a connection's
// socket is in both, and only peeked at here (MSG_PEEK), so the bytes stay
// for whoever reads the connection next. Each registration is one-shot:
// after an event the socket is not watched again until rearmed. Events
// carry a registration id, not the descriptor, so an event that comes
// after its registration was removed (the descriptor closed and its
// number reused) finds no entry and is dropped.
type connPoller struct {
	epfd int

	mu   sync.Mutex
	regs map[int32]*Detached
	next int32
}

// watchEvents: readable (bytes, or the end as a read of 0), the peer's
// half close, one-shot.
const watchEvents = syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT

// thePoller is the process's poller, made on first use; nil if epoll
// cannot be had (detach is then not used).
var thePoller = sync.OnceValue(func() *connPoller {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil
	}
	p := &connPoller{epfd: epfd, regs: map[int32]*Detached{}}
	go p.run()
	return p
})

func newConnPoller() *connPoller { return thePoller() }

// add watches dt's connection; the registration is dt.watch.
func (p *connPoller) add(dt *Detached) error {
	p.mu.Lock()
	p.next++
	dt.watch = p.next
	p.regs[dt.watch] = dt
	id := dt.watch
	p.mu.Unlock()
	err := p.ctl(dt, syscall.EPOLL_CTL_ADD)
	if err != nil {
		p.mu.Lock()
		delete(p.regs, id)
		p.mu.Unlock()
	}
	return err
}

// rearm watches dt's connection again after an event.
func (p *connPoller) rearm(dt *Detached) error { return p.ctl(dt, syscall.EPOLL_CTL_MOD) }

// remove stops watching dt's connection.
func (p *connPoller) remove(dt *Detached) {
	p.mu.Lock()
	delete(p.regs, dt.watch)
	p.mu.Unlock()
	_ = p.ctl(dt, syscall.EPOLL_CTL_DEL) // a closed socket left the set by itself
}

func (p *connPoller) ctl(dt *Detached, op int) error {
	rc, err := netpeek.RawConn(dt.tc.Conn)
	if err != nil {
		return err
	}
	var cerr error
	err = rc.Control(func(fd uintptr) {
		ev := syscall.EpollEvent{Events: watchEvents, Fd: dt.watch}
		cerr = syscall.EpollCtl(p.epfd, op, int(fd), &ev)
	})
	if err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("epoll: %w", cerr)
	}
	return nil
}

// run delivers events until the process ends.
func (p *connPoller) run() {
	events := make([]syscall.EpollEvent, 128)
	for {
		n, err := syscall.EpollWait(p.epfd, events, -1)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			panic(fmt.Sprintf("frontdoor: epoll_wait: %v", err)) // a broken epoll set is a bug
		}
		for _, ev := range events[:n] {
			p.mu.Lock()
			dt := p.regs[ev.Fd]
			p.mu.Unlock()
			if dt != nil {
				dt.ready(netpeek.Peek(dt.tc.Conn))
			}
		}
	}
}
