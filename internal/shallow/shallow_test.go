package shallow

import (
	"errors"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
)

func TestCallRunsFAndReturnsWhatItSet(t *testing.T) {
	var got int
	Call(func() { got = 42 })
	if got != 42 {
		t.Fatalf("after Call, got = %d; want 42 (f's writes seen by the caller)", got)
	}
}

func TestAPanicInFIsRaisedOnTheCallerWithItsStack(t *testing.T) {
	defer func() {
		v := recover()
		p, ok := v.(*Panic)
		if !ok {
			t.Fatalf("recovered %T %v; want a *Panic", v, v)
		}
		if p.Value != "boom" {
			t.Errorf("the panic's value is %v; want boom", p.Value)
		}
		if !strings.Contains(string(p.Stack), "deepPanic") {
			t.Errorf("the panic's stack does not show where f panicked:\n%s", p.Stack)
		}
	}()
	Call(deepPanic)
	t.Fatal("Call returned after f panicked")
}

func deepPanic() { panic("boom") }

func TestAPanicWithAnErrorUnwrapsToIt(t *testing.T) {
	defer func() {
		err, ok := recover().(error)
		if !ok || !errors.Is(err, http.ErrAbortHandler) {
			t.Fatalf("recovered %v; want an error that is http.ErrAbortHandler", err)
		}
	}()
	Call(func() { panic(http.ErrAbortHandler) })
}

func TestAGoexitInFEndsTheCallersGoroutine(t *testing.T) {
	var wg sync.WaitGroup
	returned := false
	wg.Go(func() {
		Call(func() { runtime.Goexit() })
		returned = true
	})
	wg.Wait()
	if returned {
		t.Fatal("Call returned after f called runtime.Goexit; want the caller's goroutine ended too")
	}
}

// A caller's stack stays the size of its own frames: f's deep recursion
// grows f's goroutine, which ends with it, and the caller waits as small
// as it started. The runtime reports the stacks of all goroutines
// together, so this counts them with many callers waiting; one that had
// recursed 64 KiB deep itself would hold a 64 KiB stack.
func TestCallersStackDoesNotGrowWithF(t *testing.T) {
	const goroutines = 200
	var ready, release sync.WaitGroup
	ready.Add(goroutines)
	release.Add(1)
	before := stackInUse()
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			Call(func() { recurse(64 << 10 / 128) }) // 64 KiB of frames
			ready.Done()
			release.Wait()
		})
	}
	ready.Wait()
	per := (stackInUse() - before) / goroutines
	release.Done()
	wg.Wait()
	// Each waiting goroutine holds its starting stack (a few KiB); had it
	// recursed itself, 64 KiB or more.
	if per > 16<<10 {
		t.Fatalf("each waiting caller holds %d bytes of stack; want its starting size (well under 16 KiB), not f's 64 KiB", per)
	}
}

//go:noinline
func recurse(n int) byte {
	var pad [100]byte
	if n == 0 {
		return pad[0]
	}
	pad[n%100] = byte(n)
	return recurse(n-1) + pad[(n+1)%100]
}

func stackInUse() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.StackInuse
}

// BenchmarkCall is what Call adds to a call: a goroutine's start and two
// switches.
func BenchmarkCall(b *testing.B) {
	n := 0
	for b.Loop() {
		Call(func() { n++ })
	}
	if n != b.N {
		b.Fatalf("f ran %d times in %d calls", n, b.N)
	}
}
