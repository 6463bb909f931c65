package frontdoor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// feed is a request body that arrives as the test sends it, honouring the
// read deadline its writer sets (as a connection does), on the bubble's
// clock.
type feed struct {
	data     chan []byte
	pending  []byte
	deadline time.Time
}

func newFeed() *feed { return &feed{data: make(chan []byte)} }

func (f *feed) Read(p []byte) (int, error) {
	if len(f.pending) == 0 {
		var timeout <-chan time.Time
		if !f.deadline.IsZero() {
			d := time.Until(f.deadline)
			if d <= 0 {
				return 0, os.ErrDeadlineExceeded
			}
			t := time.NewTimer(d)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case b, ok := <-f.data:
			if !ok {
				return 0, io.EOF
			}
			f.pending = b
		case <-timeout:
			return 0, os.ErrDeadlineExceeded
		}
	}
	n := copy(p, f.pending)
	f.pending = f.pending[n:]
	return n, nil
}

func (f *feed) Close() error { return nil }

// feedWriter is a response writer whose read deadline is the feed's
// (http.ResponseController finds SetReadDeadline on it).
type feedWriter struct {
	*httptest.ResponseRecorder
	f *feed
}

func (w feedWriter) SetReadDeadline(t time.Time) error { w.f.deadline = t; return nil }

// upload is a ReadBody under way in its own goroutine.
type upload struct {
	f    *feed
	done chan struct{}
	body *Body
	err  error
}

// startUpload reads a body of length declared (-1: chunked) for principal
// on conn (nil: none) through d.
func startUpload(d *Door, principal string, declared int64, conn *trackedConn) *upload {
	u := &upload{f: newFeed(), done: make(chan struct{})}
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Body, r.ContentLength = u.f, declared
	if conn != nil {
		r = r.WithContext(context.WithValue(r.Context(), connKey{}, conn))
	}
	go func() {
		defer close(u.done)
		u.body, u.err = d.ReadBody(feedWriter{httptest.NewRecorder(), u.f}, r, principal, 0)
	}()
	return u
}

// send sends n bytes of the body.
func (u *upload) send(n int) { u.f.data <- make([]byte, n) }

// end ends the body and waits for ReadBody.
func (u *upload) end() (*Body, error) {
	close(u.f.data)
	<-u.done
	return u.body, u.err
}

func (u *upload) wait() (*Body, error) { <-u.done; return u.body, u.err }

func used(d *Door) int64 {
	d.bodies.mu.Lock()
	defer d.bodies.mu.Unlock()
	return d.bodies.used
}

// Issue 24 gap 4 (P3): memory is charged as a body arrives. A body that
// declares 32 MiB and sends nothing holds one chunk; as bytes arrive it
// holds at most twice what arrived (or one chunk), and the declared length
// sizes its last growth; Release gives all of it back.
func TestABodyIsChargedAsItArrives(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New(Limits{}, nil)
		silent := startUpload(d, "hog", 32<<20, nil)
		synctest.Wait()
		if got := used(d); got != BodyChunk {
			t.Fatalf("a silent 32 MiB declaration holds %d bytes, want one chunk (%d)", got, BodyChunk)
		}
		const size = 3<<20 + 5
		u := startUpload(d, "app", size, nil)
		sent := 0
		for sent < size {
			n := min(100<<10, size-sent)
			u.send(n)
			sent += n
			synctest.Wait()
			if held := used(d) - BodyChunk; held > max(2*int64(sent), BodyChunk) || held > size {
				t.Fatalf("after %d bytes a body holds %d", sent, held)
			}
		}
		b, err := u.end()
		if err != nil || len(b.Bytes) != size || cap(b.Bytes) != size {
			t.Fatalf("the body: %v, %d bytes in a buffer of %d; want %d in one of its declared length", err, len(b.Bytes), cap(b.Bytes), size)
		}
		if got := used(d) - BodyChunk; got != size {
			t.Errorf("a whole body of %d bytes is charged %d", size, got)
		}
		b.Release()
		silent.f.data <- nil // nothing, but wakes it: still silent
		if _, err := silent.end(); err == nil {
			t.Error("a body that ended before its declared length was read")
		}
		if got := used(d); got != 0 {
			t.Errorf("%d bytes still charged after every body was released or refused", got)
		}
	})
}

// Issue 24 gap 4: one principal's bodies hold at most its share of body
// memory (PrincipalBodyMemory); its next body waits BodyWait and is
// refused with 503 naming the share and the principal, counted, while
// another principal's body is read.
func TestAPrincipalHoldsAtMostItsShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refusals"}, []string{"kind"})
		d := New(Limits{BodyMemory: 4 << 20, MaxRequest: 1 << 20, BodyWait: 2 * time.Second}, NewRefusals(nil, counter))
		if d.Limits().PrincipalBodyMemory != 2<<20 {
			t.Fatalf("default principal share %d, want half of 4 MiB", d.Limits().PrincipalBodyMemory)
		}
		var held []*Body
		for range 2 {
			u := startUpload(d, "hog", 1<<20, nil)
			u.send(1 << 20)
			b, err := u.wait()
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, b)
		}
		third := startUpload(d, "hog", 1<<20, nil)
		other := startUpload(d, "app", 1<<20, nil)
		other.send(1 << 20)
		if b, err := other.wait(); err != nil {
			t.Fatalf("another principal's body while the hog holds its share: %v", err)
		} else {
			b.Release()
		}
		began := time.Now()
		_, err := third.wait()
		var be *BodyError
		if !errors.As(err, &be) || !errors.Is(err, ErrBusy) || be.Status != http.StatusServiceUnavailable ||
			!strings.Contains(be.Error(), `principal "hog"`) || !strings.Contains(be.Error(), "body_memory_per_principal_percent") {
			t.Fatalf("the hog's third body: %v; want 503 naming its share", err)
		}
		if waited := time.Since(began); waited != 2*time.Second {
			t.Errorf("refused after %v, want BodyWait (2s)", waited)
		}
		if n := testutil.ToFloat64(counter.WithLabelValues("body_memory_principal")); n != 1 {
			t.Errorf("principal share refusals counted %v, want 1", n)
		}
		// A release within BodyWait lets a waiting body of the hog on.
		fourth := startUpload(d, "hog", 1<<20, nil)
		time.Sleep(time.Second)
		held[0].Release()
		fourth.send(1 << 20)
		if b, err := fourth.wait(); err != nil {
			t.Fatalf("a body of the hog after one of its own was released: %v", err)
		} else {
			b.Release()
		}
		held[1].Release()
		if got := used(d); got != 0 {
			t.Errorf("%d bytes still charged", got)
		}
	})
}

// Issue 24 gap 4: the bodies of one connection (HTTP/2 streams) hold at
// most one largest body (MaxRequest) together.
func TestAConnectionHoldsAtMostOneLargestBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New(Limits{BodyMemory: 8 << 20, MaxRequest: 1 << 20, PrincipalBodyMemory: 8 << 20, BodyWait: time.Second}, nil)
		conn := &trackedConn{d: d}
		first := startUpload(d, "app", 1<<20, conn)
		first.send(1 << 20)
		b, err := first.wait()
		if err != nil {
			t.Fatal(err)
		}
		_, err = startUpload(d, "app", 1<<20, conn).wait()
		if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "this connection") {
			t.Fatalf("a second body on a connection holding one largest body: %v; want refused for the connection", err)
		}
		other := startUpload(d, "app", 1<<20, &trackedConn{d: d})
		other.send(1 << 20)
		if ob, err := other.wait(); err != nil {
			t.Fatalf("a body on another connection: %v", err)
		} else {
			ob.Release()
		}
		b.Release()
		if conn.bodies != 0 {
			t.Errorf("the connection still holds %d bytes", conn.bodies)
		}
	})
}

// Issue 24 gap 4: a growth that does not fit the Edge's memory waits, and
// does not hold back smaller ones that arrive after it and fit.
func TestAGrowthThatDoesNotFitHoldsNoOneBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New(Limits{BodyMemory: 2 << 20, MaxRequest: 2 << 20, PrincipalBodyMemory: 2 << 20, BodyWait: 10 * time.Second}, nil)
		a := startUpload(d, "a", 1<<20, nil)
		a.send(1 << 20)
		held, err := a.wait()
		if err != nil {
			t.Fatal(err)
		}
		big := startUpload(d, "b", 2<<20, nil)
		big.send(BodyChunk) // then it needs to grow past what is free
		synctest.Wait()
		small := startUpload(d, "c", 100<<10, nil)
		small.send(100 << 10)
		if b, err := small.wait(); err != nil {
			t.Fatalf("a small body behind a growth that does not fit: %v", err)
		} else {
			b.Release()
		}
		held.Release()
		big.send(2<<20 - BodyChunk)
		if b, err := big.wait(); err != nil {
			t.Fatalf("the large body once memory was given back: %v", err)
		} else {
			b.Release()
		}
	})
}

// Issue 24 gap 4: a body below MinBodyRate (on average from its start,
// after BodyRateGrace) is ended with ErrBodyTooSlow (408), whose message
// names the setting and what arrived; one that keeps up is read; with no
// minimum only the body timeout ends a trickle (ErrSlowBody).
func TestABodyBelowTheMinimumRateIsEnded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New(Limits{MinBodyRate: 64 << 10, BodyRateGrace: 5 * time.Second, BodyTimeout: time.Minute}, nil)
		// 1 KiB every second, half a second out of step with the
		// deadlines (whole seconds).
		u := startUpload(d, "app", 1<<20, nil)
		began := time.Now()
		go func() {
			time.Sleep(500 * time.Millisecond)
			for {
				select {
				case u.f.data <- make([]byte, 1<<10):
				case <-u.done:
					return
				}
				time.Sleep(time.Second)
			}
		}()
		_, err := u.wait()
		var be *BodyError
		if !errors.As(err, &be) || !errors.Is(err, ErrBodyTooSlow) || be.Status != http.StatusRequestTimeout ||
			!strings.Contains(be.Error(), "64 KiB/s (limits.min_body_rate_kib)") {
			t.Fatalf("a 1 KiB/s trickle: %v; want 408 naming limits.min_body_rate_kib", err)
		}
		if took := time.Since(began); took != 6*time.Second {
			t.Errorf("the trickle was ended after %v, want 6s (the grace, then its first second behind)", took)
		}
		if got := used(d); got != 0 {
			t.Errorf("%d bytes charged after the trickle ended", got)
		}

		// At the minimum rate exactly, for 20 s: read whole.
		keep := startUpload(d, "app", 20*(64<<10), nil)
		for range 20 {
			time.Sleep(time.Second)
			keep.send(64 << 10)
		}
		if b, err := keep.wait(); err != nil {
			t.Fatalf("a body at the minimum rate: %v", err)
		} else {
			b.Release()
		}

		// No minimum: the body timeout alone.
		off := New(Limits{MinBodyRate: -1, BodyTimeout: 30 * time.Second}, nil)
		slow := startUpload(off, "app", 1<<20, nil)
		began = time.Now()
		if _, err := slow.wait(); !errors.Is(err, ErrSlowBody) || time.Since(began) != 30*time.Second {
			t.Fatalf("a silent body with no minimum rate: %v after %v; want ErrSlowBody at the 30s body timeout", err, time.Since(began))
		}
	})
}

// The time a body waits for memory does not count against its rate.
func TestAWaitForMemoryIsNotCountedAgainstTheRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New(Limits{BodyMemory: 1 << 20, MaxRequest: 1 << 20, PrincipalBodyMemory: 1 << 20, BodyWait: 10 * time.Second,
			MinBodyRate: 64 << 10, BodyRateGrace: time.Second}, nil)
		hold := startUpload(d, "a", 1<<20, nil)
		hold.send(1 << 20)
		held, err := hold.wait()
		if err != nil {
			t.Fatal(err)
		}
		u := startUpload(d, "b", 64<<10, nil)
		time.Sleep(8 * time.Second) // it waits for its first chunk
		held.Release()
		time.Sleep(500 * time.Millisecond)
		u.send(64 << 10)
		if b, err := u.wait(); err != nil {
			t.Fatalf("a body that waited 8 s for memory, then arrived at once: %v", err)
		} else {
			b.Release()
		}
	})
}

// bodyClock: the byte after read is due by the grace plus read+1 bytes at
// the rate, rounded up to a whole second, and never after the body
// timeout; a wait for memory moves it on.
func TestBodyClockDue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &bodyClock{began: t0, start: t0, end: t0.Add(time.Minute), grace: 5 * time.Second, rate: 64 << 10}
	for _, tt := range []struct {
		read int64
		want time.Duration
		rate bool
	}{
		{0, 6 * time.Second, true},
		{64<<10 - 1, 6 * time.Second, true},
		{64 << 10, 7 * time.Second, true},
		{10 * 64 << 10, 16 * time.Second, true},
		{60 * 64 << 10, time.Minute, false},
	} {
		due, rate := c.due(tt.read)
		if due.Sub(t0) != tt.want || rate != tt.rate {
			t.Errorf("after %d bytes: due at %v (rate %v), want %v (rate %v)", tt.read, due.Sub(t0), rate, tt.want, tt.rate)
		}
	}
	c.pause(3 * time.Second)
	if due, _ := c.due(0); due.Sub(t0) != 9*time.Second {
		t.Errorf("after a wait of 3s: due at %v, want 9s", due.Sub(t0))
	}
	// Huge bodies at a huge rate do not overflow.
	c = &bodyClock{start: t0, end: t0.Add(time.Hour), rate: 1 << 30}
	if due, _ := c.due(64<<30 + 512<<20); due.Sub(t0) != 65*time.Second {
		t.Errorf("64.5 GiB at 1 GiB/s: due at %v, want 65s", due.Sub(t0))
	}
}

// Issue 24 gap 5: a request refused before its body (here 401) that
// declares a body and sends none does not hold its connection: the answer
// is written within drainWindow and the connection closed, where net/http
// would wait for the body forever to keep the connection. A body read
// whole, or left unread but sent, keeps the connection for the next
// request; one past 256 KiB is still answered.
func TestABodyNobodyReadsDoesNotHoldItsConnection(t *testing.T) {
	d := New(Limits{}, nil)
	ln, err := d.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := d.Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		b, err := d.ReadBody(w, r, "app", 0)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		defer b.Release()
		fmt.Fprintf(w, "%d", len(b.Bytes))
	}), slog.New(slog.DiscardHandler))
	go srv.Serve(ln)
	defer srv.Close()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
	sent := time.Now()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a refused request whose body never comes: %v %v; want 401 at once", resp, err)
	}
	if _, err := br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("its connection was kept (%v); want it closed", err)
	}

	if took := time.Since(sent); took > drainWindow+2*time.Second {
		t.Errorf("answered after %v, want within the drain window (%v)", took, drainWindow)
	}

	k, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	k.SetReadDeadline(time.Now().Add(10 * time.Second))
	kr := bufio.NewReader(k)
	for i, tt := range []struct {
		auth string
		want int
	}{{"Authorization: k\r\n", http.StatusOK}, {"", http.StatusUnauthorized}, {"Authorization: k\r\n", http.StatusOK}} {
		io.WriteString(k, "POST / HTTP/1.1\r\nHost: x\r\n"+tt.auth+"Content-Length: 5\r\n\r\nhello")
		resp, err := http.ReadResponse(kr, nil)
		if err != nil {
			t.Fatalf("request %d on a kept-alive connection: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != tt.want {
			t.Fatalf("request %d on a kept-alive connection: %d, want %d", i, resp.StatusCode, tt.want)
		}
	}

	// Past 256 KiB net/http reads none of an unread body: the answer
	// comes at once, and the client, still writing, can read it.
	big, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	go func() {
		io.WriteString(big, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4194304\r\n\r\n")
		big.Write(make([]byte, 4<<20))
	}()
	big.SetReadDeadline(time.Now().Add(10 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(big), nil); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a refused 4 MiB body being sent: %v %v; want its 401", resp, err)
	}
}
