// Package shallow keeps the stack of a goroutine that will wait small.
//
// Go gives a goroutine the stack its deepest call needed, in powers of
// two from the runtime's starting size (the average stack in use, rounded
// up: 4 KiB in a relay whose goroutines mostly wait), and keeps it: a
// stack is shrunk by the collector only when less than a quarter of it is
// in use, so a goroutine that once went 5 KiB deep and then waits 3 KiB
// deep holds 8 KiB for as long as it waits. A request in a model's
// prefill waits for minutes, and ten thousand of them are ten thousand
// such stacks, which the collector's goal then counts a second time (P3,
// issue 25).
//
// Call runs the deep part of such a goroutine's way to its wait (the
// scheduler, opening a QUIC stream, marshalling and sealing, a dial) on a
// goroutine of its own, which ends with it: its stack goes back to the
// runtime's pool for the next call, and the caller's never grows past its
// own frames. It costs a goroutine start and two switches on the same
// processor, a microsecond or so, once per request.
package shallow

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Call runs f on a goroutine of its own and returns when f has returned.
// Everything f touches is the caller's, as if f had run on the caller's
// goroutine: the caller waits, so f needs no lock the caller would not.
// A panic in f is raised again on the caller's goroutine as a *Panic that
// carries f's stack; a runtime.Goexit in f (a test's FailNow) ends the
// caller's goroutine too.
func Call(f func()) {
	c := call{done: make(chan struct{})}
	go c.run(f)
	<-c.done
	switch {
	case c.panic != nil:
		panic(c.panic)
	case !c.returned:
		runtime.Goexit()
	}
}

// call is one Call: how its f ended.
type call struct {
	done     chan struct{}
	returned bool
	panic    *Panic
}

func (c *call) run(f func()) {
	defer close(c.done)
	defer func() {
		if !c.returned {
			if v := recover(); v != nil {
				c.panic = &Panic{Value: v, Stack: debug.Stack()}
			}
		}
	}()
	f()
	c.returned = true
}

// Panic is a panic of a function Call ran, raised again on its caller's
// goroutine: the value f panicked with and the stack it panicked on.
type Panic struct {
	Value any
	Stack []byte
}

func (p *Panic) Error() string {
	return fmt.Sprintf("%v\n\ngoroutine of shallow.Call:\n%s", p.Value, p.Stack)
}

// Unwrap is the value f panicked with, when it is an error: errors.Is and
// errors.As see through the hop (http.ErrAbortHandler, for one).
func (p *Panic) Unwrap() error {
	err, _ := p.Value.(error)
	return err
}
