package transport_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/transport"
)

// silenceHarness runs a SilenceWatch over a packet counter the test moves,
// inside a synctest bubble, and records what it reported.
type silenceHarness struct {
	t       *testing.T
	start   time.Time
	packets atomic.Uint64

	mu       sync.Mutex
	suspects []time.Duration // since start
	silent   []time.Duration // what OnSuspect was told
	heard    []time.Duration // since start
}

func startSilenceWatch(t *testing.T, after time.Duration) *silenceHarness {
	h := &silenceHarness{t: t, start: time.Now()}
	w := transport.SilenceWatch{
		After:   after,
		Packets: h.packets.Load,
		OnSuspect: func(silent time.Duration) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.suspects = append(h.suspects, time.Since(h.start))
			h.silent = append(h.silent, silent)
		},
		OnHeard: func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.heard = append(h.heard, time.Since(h.start))
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return h
}

// at advances the fake clock to start+d and lets the watch settle.
func (h *silenceHarness) at(d time.Duration) {
	h.t.Helper()
	time.Sleep(d - time.Since(h.start))
	synctest.Wait()
}

func (h *silenceHarness) report() (suspects, silent, heard []time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Duration(nil), h.suspects...), append([]time.Duration(nil), h.silent...), append([]time.Duration(nil), h.heard...)
}

// P4: a peer that sends nothing for SuspectAfter is suspect within one
// sample after that (a sixth of the window), exactly once, and told how
// long it was silent; a peer heard from is never suspect.
func TestSilentPeerIsSuspectedOnceAfterTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		after := defLive.SuspectAfter() // 6 s
		h := startSilenceWatch(t, after)
		// Heard from every keep-alive for a minute: never suspect.
		for at := time.Duration(0); at < time.Minute; at += defLive.KeepAlive() {
			h.at(at)
			h.packets.Add(1)
		}
		h.at(time.Minute)
		if s, _, _ := h.report(); len(s) != 0 {
			t.Fatalf("a peer heard from every %v was suspected at %v", defLive.KeepAlive(), s)
		}
		// Then silence: the last packet was counted at the sample at or
		// after 58 s; suspicion comes between After and After plus one
		// sample later, never before.
		lastHeard := time.Minute - defLive.KeepAlive()
		h.at(lastHeard + after - time.Nanosecond)
		if s, _, _ := h.report(); len(s) != 0 {
			t.Fatalf("suspected at %v, before %v of silence", s, after)
		}
		h.at(lastHeard + after + after/6 + after/6)
		s, silent, _ := h.report()
		if len(s) != 1 || s[0] < lastHeard+after || s[0] > lastHeard+after+after/3 {
			t.Fatalf("suspected at %v, want once within a sample or two after %v", s, lastHeard+after)
		}
		if silent[0] < after {
			t.Errorf("OnSuspect told the peer was silent %v, want at least %v", silent[0], after)
		}
		h.at(5 * time.Minute)
		if s, _, _ := h.report(); len(s) != 1 {
			t.Fatalf("suspected %d times in one silence, want once", len(s))
		}
	})
}

// P4: a suspect peer heard from again is reported at the next sample, and
// a second silence is a second suspicion.
func TestSuspectPeerHeardAgainIsClearedAndCanBeSuspectedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		after := defLive.SuspectAfter()
		h := startSilenceWatch(t, after)
		h.at(after + after/3)
		if s, _, heard := h.report(); len(s) != 1 || len(heard) != 0 {
			t.Fatalf("after %v of silence: suspects %v, heard %v", after+after/3, s, heard)
		}
		h.packets.Add(1)
		h.at(after + after/3 + after/6)
		if _, _, heard := h.report(); len(heard) != 1 {
			t.Fatalf("a suspect peer that sent a packet was not reported heard: %v", heard)
		}
		h.at(3 * after)
		if s, _, heard := h.report(); len(s) != 2 || len(heard) != 1 {
			t.Fatalf("second silence: suspects %v, heard %v; want two suspicions, one recovery", s, heard)
		}
	})
}

// P4 with R8: Probe sends a heartbeat at once, unless one is waiting for
// its answer; the response wait then runs from the probe, and the regular
// schedule is unchanged.
func TestProbeSendsAHeartbeatAtOnceAndTheWaitRunsFromIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := startHeartbeat(t)
		probeAt := 7 * time.Second
		h.at(probeAt)
		if !h.hb.Probe() {
			t.Fatal("Probe with nothing pending sent nothing")
		}
		synctest.Wait()
		sent := h.sentSoFar()
		if len(sent) != 1 || !sent[0].at.Equal(h.start.Add(probeAt)) || sent[0].seq != 1 {
			t.Fatalf("after Probe: sent %+v, want heartbeat 1 at +%v", sent, probeAt)
		}
		if h.hb.Probe() {
			t.Fatal("a second Probe sent another heartbeat while the first waits for its answer")
		}
		// The regular heartbeat still goes out at Interval.
		h.at(defLive.Interval)
		if n := len(h.sentSoFar()); n != 2 {
			t.Fatalf("at the interval: %d heartbeats, want the probe and the regular one", n)
		}
		// Unanswered, the probe's wait decides: ResponseWait after it.
		h.at(probeAt + defLive.ResponseWait - time.Nanosecond)
		if ts := h.timeoutsSoFar(); len(ts) != 0 {
			t.Fatalf("timed out at %v, before the probe's response wait", ts)
		}
		h.at(probeAt + defLive.ResponseWait)
		if ts := h.timeoutsSoFar(); len(ts) != 1 || !ts[0].Equal(h.start.Add(probeAt+defLive.ResponseWait)) {
			t.Fatalf("timeouts %v, want one at +%v", ts, probeAt+defLive.ResponseWait)
		}
		if h.hb.Probe() {
			t.Fatal("Probe after the verdict sent a heartbeat")
		}
	})
}
