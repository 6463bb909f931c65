package frontdoor

import (
	"errors"
	"fmt"
	"os"
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
// for whoever reads the connection next. The set is in the runtime's
// poller in turn, so the goroutine that waits on it parks as a read does. Each registration is one-shot:
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
	// The epoll set is itself a descriptor the runtime's poller can wait
	// on (readable while it has events): run waits there, parked like any
	// read, rather than in a blocking epoll_wait that would hold a thread
	// and leave what it hands over queued behind that system call.
	if err := syscall.SetNonblock(epfd, true); err != nil {
		syscall.Close(epfd)
		return nil
	}
	f := os.NewFile(uintptr(epfd), "frontdoor-epoll")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil
	}
	p := &connPoller{epfd: epfd, regs: map[int32]*Detached{}}
	go p.run(f, rc)
	return p
})

func newConnPoller() *connPoller { return thePoller() }

// add watches dt's connection; the registration is dt.watch. A
// connection watched before, whose watch fired, is still in the set,
// disarmed (remove): it is armed again with the new registration.
func (p *connPoller) add(dt *Detached) error {
	p.mu.Lock()
	p.next++
	dt.watch = p.next
	p.regs[dt.watch] = dt
	id := dt.watch
	p.mu.Unlock()
	err := p.ctl(dt, syscall.EPOLL_CTL_ADD)
	if errors.Is(err, syscall.EEXIST) {
		err = p.ctl(dt, syscall.EPOLL_CTL_MOD)
	}
	if err != nil {
		p.mu.Lock()
		delete(p.regs, id)
		p.mu.Unlock()
	}
	return err
}

// rearm watches dt's connection again after an event.
func (p *connPoller) rearm(dt *Detached) error { return p.ctl(dt, syscall.EPOLL_CTL_MOD) }

// remove stops watching dt's connection. One whose one-shot event fired
// (fired) is disarmed already and stays in the set, which costs nothing
// until it is armed again (add) or closed (a closed socket leaves the set
// by itself): one system call fewer for each request on a kept-alive
// connection.
func (p *connPoller) remove(dt *Detached, fired bool) {
	p.mu.Lock()
	delete(p.regs, dt.watch)
	p.mu.Unlock()
	if !fired {
		_ = p.ctl(dt, syscall.EPOLL_CTL_DEL) // a closed socket left the set by itself
	}
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

// run delivers events until the process ends. f is the epoll set's file,
// kept open (and reachable) for as long as run runs; rc its descriptor in
// the runtime's poller, where run parks until the set has events. Each
// wait asks the set first, even right after a batch: a read forgets the
// readiness signalled before it began (the runtime resets it), so an
// event that came while the last batch was handled is found only so.
func (p *connPoller) run(f *os.File, rc syscall.RawConn) {
	defer f.Close()
	events := make([]syscall.EpollEvent, 128)
	for {
		var n int
		var werr error
		err := rc.Read(func(fd uintptr) bool {
			for {
				n, werr = syscall.EpollWait(int(fd), events, 0)
				if !errors.Is(werr, syscall.EINTR) {
					return n != 0 || werr != nil // nothing ready: park until the set is readable
				}
			}
		})
		if err == nil {
			err = werr
		}
		if err != nil {
			panic(fmt.Sprintf("frontdoor: epoll_wait: %v", err)) // a broken epoll set is a bug
		}
		for _, ev := range events[:n] {
			p.mu.Lock()
			dt := p.regs[ev.Fd]
			p.mu.Unlock()
			if dt != nil {
				dt.ready(readiness(ev.Events, dt))
			}
		}
	}
}

// readiness is what an event says dt's connection has to read: bytes, when
// it says only that it is readable (the next request, nearly always); a
// peek decides when it also says the peer's end or an error, as bytes may
// have come before them.
func readiness(events uint32, dt *Detached) netpeek.Readiness {
	if events&(syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) == 0 && events&syscall.EPOLLIN != 0 {
		return netpeek.Bytes
	}
	return netpeek.Peek(dt.tc.Conn)
}
