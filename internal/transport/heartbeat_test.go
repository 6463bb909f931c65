package transport_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// R8: both sides send a heartbeat every 30 s and wait 45 s for the answer.
// R9: an answer later than that closes the connection with
// heartbeat_timeout, which is what onTimeout triggers.
//
// All tests run in a synctest bubble: the clock is fake and only moves when
// every goroutine is blocked, so times are exact to the nanosecond.

var defLive = quicwire.DefaultLiveness

// sentHeartbeat is one Heartbeat frame as the send function saw it.
type sentHeartbeat struct {
	seq      uint64
	at       time.Time
	sentNano int64
}

// hbHarness runs a Heartbeat inside a bubble with a recording send
// function and onTimeout.
type hbHarness struct {
	t      *testing.T
	hb     *transport.Heartbeat
	start  time.Time
	cancel context.CancelFunc
	done   chan struct{}

	// ackAfter, when set, makes the peer answer each heartbeat after that
	// delay.
	ackAfter *time.Duration
	// sendHook, when set, runs at the end of each send (it may block).
	sendHook func() error

	acks sync.WaitGroup // the peer's pending answers

	mu       sync.Mutex
	sent     []sentHeartbeat
	timeouts []time.Time
	badFrame *wirepb.ControlFrame
}

type hbOption func(*hbHarness)

func ackingAfter(d time.Duration) hbOption { return func(h *hbHarness) { h.ackAfter = &d } }

func sendingWith(hook func() error) hbOption { return func(h *hbHarness) { h.sendHook = hook } }

// startHeartbeat starts Run; it must be called inside synctest.Test.
func startHeartbeat(t *testing.T, opts ...hbOption) *hbHarness {
	t.Helper()
	h := &hbHarness{t: t, done: make(chan struct{})}
	for _, o := range opts {
		o(h)
	}
	h.hb = transport.NewHeartbeat(defLive, h.send, h.onTimeout)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.start = time.Now()
	go func() {
		defer close(h.done)
		h.hb.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-h.done
		h.acks.Wait()
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.badFrame != nil {
			t.Errorf("Heartbeat sent a frame that is not a heartbeat: %v", h.badFrame)
		}
	})
	return h
}

func (h *hbHarness) send(f *wirepb.ControlFrame) error {
	hb := f.GetHeartbeat()
	h.mu.Lock()
	if hb == nil {
		h.badFrame = f
	} else {
		h.sent = append(h.sent, sentHeartbeat{seq: hb.GetSeq(), at: time.Now(), sentNano: hb.GetSentUnixNano()})
	}
	h.mu.Unlock()
	if h.ackAfter != nil && hb != nil {
		d, seq := *h.ackAfter, hb.GetSeq()
		h.acks.Go(func() {
			time.Sleep(d)
			h.hb.Acked(seq)
		})
	}
	if h.sendHook != nil {
		return h.sendHook()
	}
	return nil
}

func (h *hbHarness) onTimeout() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.timeouts = append(h.timeouts, time.Now())
}

// at advances the fake clock to start+d and lets every goroutine settle.
func (h *hbHarness) at(d time.Duration) {
	h.t.Helper()
	if now := time.Since(h.start); now > d {
		h.t.Fatalf("test bug: clock already at %v, cannot go back to %v", now, d)
	}
	time.Sleep(d - time.Since(h.start))
	synctest.Wait()
}

func (h *hbHarness) sentSoFar() []sentHeartbeat {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]sentHeartbeat(nil), h.sent...)
}

func (h *hbHarness) timeoutsSoFar() []time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Time(nil), h.timeouts...)
}

func (h *hbHarness) runReturned() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

// R8: the first heartbeat goes out one interval after Run starts, then one
// every interval, numbered 1, 2, 3, ... and stamped with the send time.
func TestHeartbeatIsSentEveryIntervalStartingOneIntervalAfterRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHeartbeat(t)
		for k := 1; k <= 10; k++ {
			due := time.Duration(k) * defLive.Interval
			h.at(due - time.Nanosecond)
			if n := len(h.sentSoFar()); n != k-1 {
				t.Fatalf("at %v: %d heartbeats sent, want %d", due-time.Nanosecond, n, k-1)
			}
			h.at(due)
			sent := h.sentSoFar()
			if len(sent) != k {
				t.Fatalf("at %v: %d heartbeats sent, want %d", due, len(sent), k)
			}
			got := sent[k-1]
			if got.seq != uint64(k) || !got.at.Equal(h.start.Add(due)) || got.sentNano != got.at.UnixNano() {
				t.Fatalf("heartbeat %d = seq %d at +%v stamped %d; want seq %d at +%v stamped with the send time",
					k, got.seq, got.at.Sub(h.start), got.sentNano, k, due)
			}
			h.hb.Acked(uint64(k))
		}
		if ts := h.timeoutsSoFar(); len(ts) != 0 {
			t.Fatalf("acked heartbeats timed out at %v", ts)
		}
	})
}

// R8, R9: with no answer, onTimeout fires exactly once, exactly
// ResponseWait after the first unanswered heartbeat was sent.
func TestFirstUnansweredHeartbeatTimesOutAtExactlyResponseWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHeartbeat(t)
		deadline := defLive.Interval + defLive.ResponseWait // first sent at Interval

		h.at(deadline - time.Nanosecond)
		if ts := h.timeoutsSoFar(); len(ts) != 0 {
			t.Fatalf("onTimeout called early, at +%v", ts[0].Sub(h.start))
		}
		h.at(deadline)
		ts := h.timeoutsSoFar()
		if len(ts) != 1 || !ts[0].Equal(h.start.Add(deadline)) {
			t.Fatalf("timeouts at %v; want exactly one at +%v", ts, deadline)
		}

		sentAtTimeout := len(h.sentSoFar())
		h.at(deadline + time.Hour)
		if n := len(h.timeoutsSoFar()); n != 1 {
			t.Fatalf("onTimeout called %d times, want exactly once", n)
		}
		// The peer is declared dead: no more heartbeats, and Run ends by
		// itself.
		if n := len(h.sentSoFar()); n != sentAtTimeout {
			t.Fatalf("%d heartbeats sent after the timeout", n-sentAtTimeout)
		}
		if !h.runReturned() {
			t.Fatal("Run still running an hour after the heartbeat timed out")
		}
	})
}

// R8: answers that come in time, however slow (a prefill or backpressure on
// the data streams does not slow the control stream), never trip the
// timeout, even over an hour.
func TestPromptlyAckedHeartbeatsNeverTimeOut(t *testing.T) {
	for _, delay := range []time.Duration{0, 3 * time.Second, defLive.Interval + time.Second, defLive.ResponseWait - time.Nanosecond} {
		t.Run(delay.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := startHeartbeat(t, ackingAfter(delay))
				h.at(time.Hour + defLive.ResponseWait)
				if ts := h.timeoutsSoFar(); len(ts) != 0 {
					t.Fatalf("onTimeout at +%v though every heartbeat was acked after %v", ts[0].Sub(h.start), delay)
				}
				if n, want := len(h.sentSoFar()), int((time.Hour+defLive.ResponseWait)/defLive.Interval); n != want {
					t.Fatalf("%d heartbeats sent, want %d", n, want)
				}
				if rtt, _ := h.hb.LastRTT(); rtt != delay {
					t.Fatalf("LastRTT = %v, want %v", rtt, delay)
				}
			})
		})
	}
}

// Acks come in order on one stream: an ack for seq N settles every
// heartbeat before it, and the deadline moves to the next unanswered one.
func TestAckSettlesEveryEarlierHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHeartbeat(t)
		h.at(2*defLive.Interval + time.Second) // 1 sent at 30 s, 2 at 60 s
		if n := len(h.sentSoFar()); n != 2 {
			t.Fatalf("%d heartbeats sent, want 2", n)
		}
		h.hb.Acked(2)
		if rtt, _ := h.hb.LastRTT(); rtt != time.Second {
			t.Fatalf("LastRTT = %v, want 1s (heartbeat 2's round trip)", rtt)
		}

		// Heartbeat 1's deadline (75 s) passes without a verdict.
		h.at(defLive.Interval + defLive.ResponseWait)
		if ts := h.timeoutsSoFar(); len(ts) != 0 {
			t.Fatalf("heartbeat 1 timed out at +%v although ack 2 settled it", ts[0].Sub(h.start))
		}
		// Heartbeat 3 (sent at 90 s) is never answered.
		deadline := 3*defLive.Interval + defLive.ResponseWait
		h.at(deadline - time.Nanosecond)
		if ts := h.timeoutsSoFar(); len(ts) != 0 {
			t.Fatalf("onTimeout called early, at +%v", ts[0].Sub(h.start))
		}
		h.at(deadline)
		if ts := h.timeoutsSoFar(); len(ts) != 1 || !ts[0].Equal(h.start.Add(deadline)) {
			t.Fatalf("timeouts at %v; want exactly one at +%v", ts, deadline)
		}
	})
}

func TestLastRTTIsTheRoundTripOfTheAckedHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHeartbeat(t)
		if rtt, at := h.hb.LastRTT(); rtt != 0 || !at.IsZero() {
			t.Fatalf("LastRTT before any heartbeat = %v at %v, want zero", rtt, at)
		}
		h.at(defLive.Interval + time.Second) // heartbeat 1 sent, unanswered
		if rtt, at := h.hb.LastRTT(); rtt != 0 || !at.IsZero() {
			t.Fatalf("LastRTT before any ack = %v at %v, want zero", rtt, at)
		}

		h.at(defLive.Interval + 3*time.Second)
		h.hb.Acked(1)
		if rtt, at := h.hb.LastRTT(); rtt != 3*time.Second || !at.Equal(h.start.Add(defLive.Interval+3*time.Second)) {
			t.Fatalf("LastRTT = %v at +%v, want 3s at +%v", rtt, at.Sub(h.start), defLive.Interval+3*time.Second)
		}

		h.at(2*defLive.Interval + 500*time.Millisecond)
		h.hb.Acked(2)
		if rtt, _ := h.hb.LastRTT(); rtt != 500*time.Millisecond {
			t.Fatalf("LastRTT after the second ack = %v, want 500ms", rtt)
		}
	})
}

// An ack for a heartbeat that was never sent (or was already settled) is
// ignored: it must neither settle the pending heartbeat nor report an RTT.
func TestAckForNeverSentHeartbeatIsIgnored(t *testing.T) {
	cases := []struct {
		name string
		seq  uint64
	}{
		{"seq_zero", 0},
		{"next_seq_not_yet_sent", 2},
		{"far_future_seq", 1000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := startHeartbeat(t)
				h.at(defLive.Interval + time.Second) // heartbeat 1 pending
				h.hb.Acked(tc.seq)
				if rtt, at := h.hb.LastRTT(); rtt != 0 || !at.IsZero() {
					t.Errorf("ack for unsent seq %d reported an RTT of %v", tc.seq, rtt)
				}
				deadline := defLive.Interval + defLive.ResponseWait
				h.at(deadline)
				if ts := h.timeoutsSoFar(); len(ts) != 1 || !ts[0].Equal(h.start.Add(deadline)) {
					t.Fatalf("after a bogus ack for seq %d: timeouts at %v, want exactly one at +%v (heartbeat 1 was never answered)",
						tc.seq, ts, deadline)
				}
			})
		})
	}
}

func TestDuplicateAckDoesNotSettleLaterHeartbeats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHeartbeat(t)
		h.at(defLive.Interval + time.Second)
		h.hb.Acked(1)
		h.at(2*defLive.Interval + time.Second) // heartbeat 2 pending
		h.hb.Acked(1)
		deadline := 2*defLive.Interval + defLive.ResponseWait
		h.at(deadline)
		if ts := h.timeoutsSoFar(); len(ts) != 1 || !ts[0].Equal(h.start.Add(deadline)) {
			t.Fatalf("timeouts at %v, want exactly one at +%v", ts, deadline)
		}
	})
}

// Cancelling Run ends it and every timer with it: a connection that closed
// for another reason must not be reported as a heartbeat timeout later.
func TestCancelledHeartbeatStopsAndNoTimerFiresLater(t *testing.T) {
	for _, cancelAt := range []time.Duration{defLive.Interval / 2, defLive.Interval + time.Second, defLive.Interval + defLive.ResponseWait - time.Nanosecond} {
		t.Run(cancelAt.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := startHeartbeat(t)
				h.at(cancelAt)
				sent := len(h.sentSoFar())
				h.cancel()
				synctest.Wait()
				if !h.runReturned() {
					t.Fatal("Run did not return after its context was cancelled")
				}
				h.at(cancelAt + 24*time.Hour)
				if ts := h.timeoutsSoFar(); len(ts) != 0 {
					t.Fatalf("onTimeout fired at +%v, after Run was cancelled at +%v", ts[0].Sub(h.start), cancelAt)
				}
				if n := len(h.sentSoFar()); n != sent {
					t.Fatalf("%d heartbeats sent after cancel", n-sent)
				}
			})
		})
	}
}

// The deadline is a timer of its own: a send stuck on a dead link (its
// write never returns) cannot postpone the verdict (R9).
func TestBlockedSendDoesNotDelayTheTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errClosed := errors.New("connection closed")
		release := make(chan struct{})
		h := startHeartbeat(t, sendingWith(func() error {
			<-release // the write is stuck until the connection closes
			return errClosed
		}))
		deadline := defLive.Interval + defLive.ResponseWait
		h.at(deadline - time.Nanosecond)
		if ts := h.timeoutsSoFar(); len(ts) != 0 {
			t.Fatalf("onTimeout called early, at +%v", ts[0].Sub(h.start))
		}
		h.at(deadline)
		if ts := h.timeoutsSoFar(); len(ts) != 1 || !ts[0].Equal(h.start.Add(deadline)) {
			t.Fatalf("timeouts at %v; want exactly one at +%v although the send is still blocked", ts, deadline)
		}
		if n := len(h.sentSoFar()); n != 1 {
			t.Fatalf("%d sends started, want 1 (the first is still blocked)", n)
		}
		// The owner closes the connection, which fails the stuck write;
		// Run then ends by itself.
		close(release)
		synctest.Wait()
		if !h.runReturned() {
			t.Fatal("Run did not return after its send failed")
		}
		if n := len(h.timeoutsSoFar()); n != 1 {
			t.Fatalf("onTimeout called %d times, want once", n)
		}
	})
}

// R8: the liveness profile both daemons run.
func TestDefaultLivenessIs30sInterval45sWait(t *testing.T) {
	if defLive.Interval != 30*time.Second || defLive.ResponseWait != 45*time.Second {
		t.Fatalf("DefaultLiveness = %+v, want 30s interval and 45s wait (R8)", defLive)
	}
	if err := defLive.Validate(); err != nil {
		t.Fatalf("DefaultLiveness does not validate: %v", err)
	}
}

func TestLivenessValidateRejectsProfilesThatCannotWork(t *testing.T) {
	s := time.Second
	cases := []struct {
		name string
		l    quicwire.Liveness
		ok   bool
	}{
		{"default", quicwire.DefaultLiveness, true},
		{"scaled", quicwire.DefaultLiveness.Scaled(30), true},
		{"wait_equals_interval", quicwire.Liveness{Interval: s, ResponseWait: s}, true},
		{"zero", quicwire.Liveness{}, false},
		{"zero_interval", quicwire.Liveness{ResponseWait: 45 * s}, false},
		{"zero_wait", quicwire.Liveness{Interval: 30 * s}, false},
		{"negative_interval", quicwire.Liveness{Interval: -s, ResponseWait: 45 * s}, false},
		{"negative_wait", quicwire.Liveness{Interval: 30 * s, ResponseWait: -s}, false},
		{"wait_shorter_than_interval", quicwire.Liveness{Interval: 30 * s, ResponseWait: 29 * s}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.Validate()
			if tc.ok && err != nil {
				t.Fatalf("Validate(%+v) = %v, want nil", tc.l, err)
			}
			if !tc.ok && err == nil {
				t.Fatalf("Validate(%+v) = nil, want an error", tc.l)
			}
		})
	}
}

func TestScaledLivenessDividesBothDurations(t *testing.T) {
	got := quicwire.DefaultLiveness.Scaled(30)
	if want := (quicwire.Liveness{Interval: time.Second, ResponseWait: 1500 * time.Millisecond}); got != want {
		t.Fatalf("Scaled(30) = %+v, want %+v", got, want)
	}
	for _, div := range []int{1, 0, -5} {
		if got := quicwire.DefaultLiveness.Scaled(div); got != quicwire.DefaultLiveness {
			t.Fatalf("Scaled(%d) = %+v, want the profile unchanged", div, got)
		}
	}
}

// The heartbeat, not QUIC's idle timeout, decides liveness and names the
// reason (R9); keep-alives stay under common NAT binding timeouts.
func TestIdleTimeoutLeavesRoomForTheHeartbeatVerdict(t *testing.T) {
	for _, l := range []quicwire.Liveness{quicwire.DefaultLiveness, quicwire.DefaultLiveness.Scaled(30)} {
		if idle := l.IdleTimeout(); idle <= l.Interval+l.ResponseWait {
			t.Errorf("%+v: IdleTimeout %v <= Interval+ResponseWait %v", l, idle, l.Interval+l.ResponseWait)
		}
		if ka := l.KeepAlive(); ka <= 0 || ka > 15*time.Second || ka >= l.IdleTimeout() {
			t.Errorf("%+v: KeepAlive %v, want in (0, 15s] and below the idle timeout", l, ka)
		}
		// P4: suspicion comes well before the heartbeat's verdict.
		if sa := l.SuspectAfter(); sa <= l.KeepAlive() || sa >= l.ResponseWait {
			t.Errorf("%+v: SuspectAfter %v, want above KeepAlive %v and below the response wait", l, sa, l.KeepAlive())
		}
	}
}

// Issue 26: "heard from again" is not "ready". The owner learns which
// heartbeat an answer was for (its send time), so it can tell an answer to
// a heartbeat sent after a silence, which proves the data path both ways,
// from one that was on its way before. Each answer is reported once, for
// the heartbeat the ack names; earlier ones it settles, duplicates and acks
// for heartbeats never sent report nothing.
func TestOnAnswerReportsTheSendTimeOfEachAnsweredHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHeartbeat(t)
		var mu sync.Mutex
		var answered []time.Time
		h.hb.OnAnswer(func(sent time.Time) {
			mu.Lock()
			defer mu.Unlock()
			answered = append(answered, sent)
		})
		got := func() []time.Time {
			mu.Lock()
			defer mu.Unlock()
			return append([]time.Time(nil), answered...)
		}
		h.at(2*defLive.Interval + time.Second) // 1 at 30 s, 2 at 60 s
		h.hb.Acked(5)                          // never sent
		h.hb.Acked(2)                          // settles 1 too
		h.hb.Acked(2)                          // duplicate
		h.hb.Acked(1)                          // already settled
		want := []time.Time{h.start.Add(2 * defLive.Interval)}
		if a := got(); len(a) != 1 || !a[0].Equal(want[0]) {
			t.Fatalf("answers reported %v, want exactly heartbeat 2's send time %v", a, want[0])
		}
		h.at(3*defLive.Interval + time.Second)
		h.hb.Acked(3)
		if a := got(); len(a) != 2 || !a[1].Equal(h.start.Add(3*defLive.Interval)) {
			t.Fatalf("answers reported %v, want heartbeat 3's at +%v second", a, 3*defLive.Interval)
		}
	})
}

// Issue 26 with R8, R9: ProbeNow sends a heartbeat at once even while an
// earlier one waits (Probe would not), so the answer to a fresh heartbeat
// can prove a healed link; the verdict is still the oldest unanswered
// heartbeat's, not postponed by the newer one.
func TestProbeNowSendsBesideAPendingHeartbeatWithoutMovingTheVerdict(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHeartbeat(t)
		h.at(defLive.Interval + time.Second) // 1 sent at 30 s, pending
		if h.hb.Probe() {
			t.Fatal("Probe sent a heartbeat while one is waiting for its answer")
		}
		if !h.hb.ProbeNow() {
			t.Fatal("ProbeNow sent nothing")
		}
		sent := h.sentSoFar()
		if len(sent) != 2 || sent[1].seq != 2 || !sent[1].at.Equal(h.start.Add(defLive.Interval+time.Second)) {
			t.Fatalf("sent %v, want heartbeat 2 at +%v", sent, defLive.Interval+time.Second)
		}
		deadline := defLive.Interval + defLive.ResponseWait
		h.at(deadline - time.Nanosecond)
		if ts := h.timeoutsSoFar(); len(ts) != 0 {
			t.Fatalf("onTimeout early, at +%v", ts[0].Sub(h.start))
		}
		h.at(deadline)
		if ts := h.timeoutsSoFar(); len(ts) != 1 || !ts[0].Equal(h.start.Add(deadline)) {
			t.Fatalf("timeouts at %v, want exactly one at +%v (heartbeat 1's deadline)", ts, deadline)
		}
		if h.hb.ProbeNow() {
			t.Fatal("ProbeNow sent a heartbeat after the verdict")
		}
	})
}
