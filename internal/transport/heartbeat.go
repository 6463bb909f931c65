package transport

import (
	"context"
	"sync"
	"time"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Heartbeat runs one side's half of the liveness protocol on the control
// stream (R8, R9): it sends a Heartbeat every Liveness.Interval and expects
// each to be acknowledged within Liveness.ResponseWait. When the oldest
// unacknowledged heartbeat is older than the wait, it calls onTimeout once;
// the owner closes the connection with CloseHeartbeatTimeout.
//
// The deadline is a timer of its own, not a step of the send loop: a send
// that blocks on a dead link cannot delay the verdict.
type Heartbeat struct {
	live      quicwire.Liveness
	send      func(*wirepb.ControlFrame) error
	onTimeout func()

	mu       sync.Mutex
	seq      uint64
	pending  []sentPing // unacknowledged, oldest first
	timer    *time.Timer
	expired  bool
	lastRTT  time.Duration
	lastAck  time.Time
	onAnswer func(sent time.Time)
}

type sentPing struct {
	seq  uint64
	sent time.Time
}

// NewHeartbeat returns a heartbeat that sends with send and calls onTimeout
// when an answer is overdue.
func NewHeartbeat(live quicwire.Liveness, send func(*wirepb.ControlFrame) error, onTimeout func()) *Heartbeat {
	return &Heartbeat{live: live, send: send, onTimeout: onTimeout}
}

// Run sends heartbeats until ctx is done. The first goes out one interval
// after Run starts.
func (h *Heartbeat) Run(ctx context.Context) {
	t := time.NewTicker(h.live.Interval)
	defer t.Stop()
	defer h.stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !h.ping() {
				return
			}
		}
	}
}

// ping records and sends one heartbeat; it reports false once the
// heartbeat has expired or the send failed (the connection is ending).
func (h *Heartbeat) ping() bool {
	h.mu.Lock()
	if h.expired {
		h.mu.Unlock()
		return false
	}
	h.seq++
	p := sentPing{seq: h.seq, sent: time.Now()}
	h.pending = append(h.pending, p)
	if h.timer == nil {
		h.timer = time.AfterFunc(h.live.ResponseWait, h.check)
	}
	h.mu.Unlock()
	err := h.send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_Heartbeat{
		Heartbeat: &wirepb.Heartbeat{Seq: p.seq, SentUnixNano: p.sent.UnixNano()},
	}})
	return err == nil
}

// Probe sends a heartbeat now, ahead of the schedule, unless one is
// already waiting for its answer; it reports whether it sent one. The
// owner calls it when the peer falls silent (SilenceWatch): the response
// wait then runs from the silence, not from the next tick, and the
// heartbeat still decides the verdict (R8, R9). The heartbeat's frame is
// also what draws a stateless reset from a restarted Edge
// (EdgeConnectionIDLength). The regular schedule is unchanged.
func (h *Heartbeat) Probe() bool {
	h.mu.Lock()
	if h.expired || len(h.pending) > 0 {
		h.mu.Unlock()
		return false
	}
	h.mu.Unlock()
	return h.ping()
}

// ProbeNow sends a heartbeat now, even while others wait for their
// answers; it reports whether it sent one. The owner calls it when a
// silent peer is heard from again: what proves the data path both ways is
// an answer to a heartbeat sent after the silence (OnAnswer), and the
// answer to a fresh one does not wait for the retransmission of one lost
// in the silence (new data draws acknowledgements that make QUIC
// retransmit the lost one at once, too). The verdict is unchanged: it is
// the oldest unanswered heartbeat's (R8, R9), and a later one never
// postpones it.
func (h *Heartbeat) ProbeNow() bool { return h.ping() }

// OnAnswer arranges for f to be called with the send time of each
// heartbeat the peer answers (the one an ack names, not the earlier ones
// it settles), once per answer, on the goroutine that calls Acked and
// without the heartbeat's lock held. Call it before Run; f may be nil.
func (h *Heartbeat) OnAnswer(f func(sent time.Time)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onAnswer = f
}

// Acked handles the peer's HeartbeatAck. Acks come in order on one stream,
// so an ack for seq also settles every earlier heartbeat. An ack for a
// heartbeat never sent is ignored.
func (h *Heartbeat) Acked(seq uint64) {
	h.mu.Lock()
	if seq == 0 || seq > h.seq {
		// Never sent: settling anything on its account would let a peer
		// that answers nothing postpone the verdict forever.
		h.mu.Unlock()
		return
	}
	now := time.Now()
	var answered time.Time
	i := 0
	for i < len(h.pending) && h.pending[i].seq <= seq {
		if h.pending[i].seq == seq {
			answered = h.pending[i].sent
			h.lastRTT = now.Sub(answered)
			h.lastAck = now
		}
		i++
	}
	h.pending = h.pending[i:]
	h.rearm(now)
	f := h.onAnswer
	h.mu.Unlock()
	// A duplicate ack (its heartbeat already settled) answers nothing.
	if f != nil && !answered.IsZero() {
		f(answered)
	}
}

// rearm points the timer at the oldest pending heartbeat's deadline.
// Callers hold mu.
func (h *Heartbeat) rearm(now time.Time) {
	if h.timer == nil {
		return
	}
	if len(h.pending) == 0 {
		h.timer.Stop()
		h.timer = nil
		return
	}
	h.timer.Reset(h.pending[0].sent.Add(h.live.ResponseWait).Sub(now))
}

func (h *Heartbeat) check() {
	h.mu.Lock()
	now := time.Now()
	if h.expired || len(h.pending) == 0 {
		h.mu.Unlock()
		return
	}
	if now.Sub(h.pending[0].sent) < h.live.ResponseWait {
		h.rearm(now)
		h.mu.Unlock()
		return
	}
	h.expired = true
	h.timer = nil
	h.mu.Unlock()
	h.onTimeout()
}

func (h *Heartbeat) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	h.expired = true
}

// LastRTT is the round-trip time of the last acknowledged heartbeat, and
// when that ack arrived; zero before the first.
func (h *Heartbeat) LastRTT() (time.Duration, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastRTT, h.lastAck
}

// AckFor answers the peer's heartbeat.
func AckFor(hb *wirepb.Heartbeat) *wirepb.ControlFrame {
	return &wirepb.ControlFrame{Msg: &wirepb.ControlFrame_HeartbeatAck{HeartbeatAck: &wirepb.HeartbeatAck{Seq: hb.GetSeq()}}}
}
