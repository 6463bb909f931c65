package edgeclient

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/quicwire"
)

// A connection that falls silent is raced by a fresh one (issue 26).
//
// The old connection may be fine and only its link down for a while; or
// the link healed but its QUIC sender is still backing off the
// retransmissions of the cut (packets that only acknowledge do not reset
// that backoff, so the Edge hears ACKs and nothing else); or the Edge
// restarted and the old connection is gone (with a new stateless reset
// key, the Node cannot even recognise the resets). Waiting on the old
// connection's heartbeat verdict costs up to a response wait in every
// case. So when the old falls silent, the Node also dials a fresh
// connection beside it, on the same socket, in short handshake attempts
// repeated while the old stays unproven, and whichever proves itself first
// carries the Node on:
//
//   - the old, by an answer to a heartbeat sent after the silence began:
//     the fresh attempt is abandoned, closed before it registers;
//   - the fresh one, by completing its handshake and its registration
//     (the Edge's registry supersedes the old generation), and the fresh
//     connection is served at once, with no backoff. The old is closed at
//     once, its streams ending with their error now rather than at the
//     fence, unless it carries streams and the Edge lets it drain them
//     (RegisterRequest.drain_previous_generation): the Edge still holds
//     it, and the fresh connection came over the same path, so the link
//     is back for the old one too, and only its senders' retransmission
//     backoff (quic-go doubles its probe timeout up to 60 s and resets it
//     only on an ACK of its own packets; after a long cut neither side
//     sends for seconds to tens of seconds) holds its streams. It takes
//     no new work, its streams resume when its backoff ends, and the
//     Edge closes it when they are done.
//
// A fresh connection that completes its handshake while the old has been
// heard from again waits up to Liveness.ResumeGrace for the old to prove
// itself, so that a link that heals in time keeps its generation.

// raceAttempt bounds one handshake attempt of the race: on a link that is
// still down the attempt's Initial packets are lost and their
// retransmissions back off, so a fresh attempt (with fresh timers) every
// raceAttempt completes within about one attempt of the heal.
const raceAttempt = 2 * time.Second

// raceFor bounds the whole race: past an interval and a response wait the
// old connection has had its heartbeat verdict, and an Edge still
// unreachable is left to Run's backoff.
func raceFor(l quicwire.Liveness) time.Duration { return l.Interval + l.ResponseWait }

// watchTick is how often watchEdge samples the connection.
func watchTick(l quicwire.Liveness) time.Duration {
	return max(min(l.UnansweredAfter()/10, 100*time.Millisecond), time.Millisecond)
}

// watchEdge watches the connection for silence (P4) and starts the race:
//
//   - nothing at all from the Edge for Liveness.SuspectAfter: the Edge is
//     suspect; a heartbeat goes out at once (Heartbeat.Probe; it also
//     draws a stateless reset from a restarted Edge that has its key) and
//     the race starts;
//   - what the Node sent unanswered (no packet back) for
//     Liveness.UnansweredAfter: a heartbeat goes out at once; if that one
//     too draws no packet at all for UnansweredAfter, the race starts.
//     This catches a restarted Edge within about two seconds on a busy
//     Node, whatever its reset key.
//
// The old connection proves itself by an answer to a heartbeat sent after
// the silence began; the watch then calls the race off. Work in flight is
// left alone; the heartbeat's verdict (R8, R9) still stands.
func (c *Client) watchEdge(ctx context.Context, conn *connection, race *race, log *slog.Logger) {
	live := c.opts.Liveness
	t := time.NewTicker(watchTick(live))
	defer t.Stop()
	stats := func() (recv, sent uint64) {
		s := conn.qc.ConnectionStats()
		return s.PacketsReceived, s.PacketsSent
	}
	// PacketsReceived counts only packets the connection could decrypt and
	// process (quic-go v0.65 counts in sentPacketHandler.ReceivedPacket,
	// after unpacking): a new Edge process's packets and unrecognised
	// stateless resets do not make the Edge "heard from".
	lastRecv, lastSent := stats()
	heardAt := time.Now()
	var probedAt, silentSince time.Time // zero: not probed, not suspect
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		recv, sent := stats()
		sentSinceHeard := sent != lastSent
		if recv != lastRecv {
			lastRecv, lastSent, heardAt = recv, sent, now
			sentSinceHeard = false
		}
		if !silentSince.IsZero() {
			if _, at := conn.hb.LastRTT(); !at.Before(silentSince) {
				log.Info("edge heard from again: a heartbeat was answered", "silent_for", at.Sub(silentSince).Round(time.Millisecond))
				race.callOff()
				silentSince, probedAt = time.Time{}, time.Time{}
			}
			continue
		}
		silent := now.Sub(heardAt)
		switch {
		case silent >= live.SuspectAfter():
			log.Warn("edge not heard from; probing with a heartbeat and dialling a fresh connection", "silent_for", silent.Round(time.Millisecond))
			silentSince = heardAt
			conn.hb.Probe()
			race.start(silentSince)
		case !probedAt.IsZero() && probedAt.After(heardAt) && now.Sub(probedAt) >= live.UnansweredAfter():
			log.Warn("edge did not answer a heartbeat; dialling a fresh connection", "silent_for", silent.Round(time.Millisecond))
			silentSince = heardAt
			race.start(silentSince)
		case sentSinceHeard && silent >= live.UnansweredAfter() && !probedAt.After(heardAt):
			// Sent something and heard nothing back: ask. (An ACK-only
			// packet of ours also counts as sent; the cost of that false
			// alarm is one heartbeat.)
			probedAt = now
			conn.hb.Probe()
		}
	}
}

// race is one connection's race against a fresh connection.
type race struct {
	ctx context.Context // Run's: the race outlives the old connection, not the Node
	c   *Client
	tr  *quic.Transport
	old *connection
	log *slog.Logger

	mu        sync.Mutex
	started   bool
	calledOff bool
	claimed   bool // the fresh connection is registering
	cancel    context.CancelFunc
	done      chan struct{}
	won       *registered
	// drains carries the winner when the old connection is left to drain
	// its streams rather than closed: serve then hands it over at once.
	drains chan *registered
}

func newRace(ctx context.Context, c *Client, tr *quic.Transport, old *connection, log *slog.Logger) *race {
	return &race{ctx: ctx, c: c, tr: tr, old: old, log: log, drains: make(chan *registered, 1)}
}

// start starts the race, once; silentSince is when the old fell silent.
func (r *race) start(silentSince time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started && !r.calledOff {
		return
	}
	if r.started {
		// Called off before (the old proved itself), silent again: wait
		// for the previous attempt to have let go, then race anew.
		r.mu.Unlock()
		<-r.done
		r.mu.Lock()
		if r.won != nil {
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.ctx, raceFor(r.c.opts.Liveness))
	r.started, r.calledOff, r.claimed, r.cancel, r.done = true, false, false, cancel, make(chan struct{})
	recv := r.old.qc.ConnectionStats().PacketsReceived
	go func() {
		defer close(r.done)
		defer cancel()
		r.run(ctx, silentSince, recv)
	}()
}

// callOff ends the race in the old connection's favour, unless the fresh
// connection is already registering.
func (r *race) callOff() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.started || r.claimed || r.calledOff {
		return
	}
	r.calledOff = true
	r.cancel()
}

func (r *race) isCalledOff() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calledOff
}

// outcome waits for a race in progress and returns the fresh connection
// that won it, if one did. serve calls it once the old connection is over.
func (r *race) outcome() *registered {
	r.mu.Lock()
	if !r.started {
		r.mu.Unlock()
		return nil
	}
	done := r.done
	r.mu.Unlock()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.won
}

// run dials until a fresh connection registers, the old proves itself, or
// the race's time is up.
func (r *race) run(ctx context.Context, silentSince time.Time, oldRecv uint64) {
	c := r.c
	for ctx.Err() == nil && !c.draining.Load() {
		began := time.Now()
		qc, err := c.dial(ctx, r.tr, raceAttempt)
		if err != nil {
			r.log.Debug("fresh connection attempt failed", "err", err)
			// A refusal or a fast failure: do not spin.
			if wait := raceAttempt - time.Since(began); wait > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(min(wait, time.Second)):
				}
			}
			continue
		}
		if !r.claim(ctx, qc, oldRecv, silentSince) {
			if qc.Context().Err() != nil && ctx.Err() == nil && !r.isCalledOff() {
				continue // the fresh one died before it could register
			}
			quicwire.CloseNormal.Close(qc, "the old connection resumed")
			r.log.Info("edge connection resumed; fresh connection abandoned")
			return
		}
		// Streams on the old connection may resume: ask the Edge to let
		// it drain them. Only the Edge knows whether it still holds it.
		var drain uint64
		if r.old.qc.Context().Err() == nil && r.old.streams.Load() > 0 {
			drain = r.old.sess.Generation()
		}
		reg, err := c.registerOn(ctx, qc, drain)
		if err != nil {
			r.log.Warn("fresh connection did not register", "err", err)
			r.mu.Lock()
			r.claimed = false
			r.mu.Unlock()
			continue
		}
		r.mu.Lock()
		r.won = reg
		r.mu.Unlock()
		if reg.previousDrains {
			r.log.Info("a fresh connection replaced the silent one, which drains its streams", "silent_for", time.Since(silentSince).Round(time.Millisecond), "new_generation", reg.gen, "streams", r.old.streams.Load())
			r.drains <- reg
			return
		}
		r.log.Info("a fresh connection replaced the silent one", "silent_for", time.Since(silentSince).Round(time.Millisecond), "new_generation", reg.gen)
		// The old is done: its streams end now, with their error.
		quicwire.CloseSuperseded.Close(r.old.qc, "replaced by a fresh connection after a silence")
		return
	}
}

// claim decides, once the fresh connection's handshake is done, whether it
// goes on to register. Not if the old proves itself meanwhile. The fresh
// handshake says the link is up. After a short silence (under
// Liveness.SuspectAfter: what an Edge restarted at once looks like), an
// old connection not heard from at all within Liveness.UnansweredAfter of
// the handshake is gone and is replaced then. After a longer silence (a
// link cut, whose heal the old connection's backed-off retransmission
// timers notice late), and whenever the old is heard from again, the old
// gets until Liveness.ResumeGrace to prove itself and keep its
// generation; except that an old connection with streams in flight is
// replaced at once, the Edge asked to let it drain them.
func (r *race) claim(ctx context.Context, qc *quic.Conn, oldRecv uint64, silentSince time.Time) bool {
	live := r.c.opts.Liveness
	unheard := live.UnansweredAfter()
	if time.Since(silentSince) >= live.SuspectAfter() {
		unheard = live.ResumeGrace()
	}
	heardWait := time.NewTimer(unheard)
	defer heardWait.Stop()
	grace := time.NewTimer(live.ResumeGrace())
	defer grace.Stop()
	tick := time.NewTicker(watchTick(live))
	defer tick.Stop()
	heard := func() bool { return r.old.qc.ConnectionStats().PacketsReceived != oldRecv }
	heardWaitOver, graceOver := false, false
	for {
		r.mu.Lock()
		switch {
		case r.calledOff || ctx.Err() != nil:
			r.mu.Unlock()
			return false
		case r.old.qc.Context().Err() != nil || (heardWaitOver && !heard()) || graceOver,
			r.old.streams.Load() > 0:
			// Gone, unheard or out of grace: replace it. With streams:
			// replace it now, asking the Edge to let it drain them (run),
			// so that new work is served without waiting on it and its
			// heartbeat's verdict cannot cut its streams meanwhile.
			r.claimed = true
			r.mu.Unlock()
			return true
		}
		r.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-r.old.qc.Context().Done():
		case <-qc.Context().Done():
			return false
		case <-heardWait.C:
			heardWaitOver = true
		case <-grace.C:
			graceOver = true
		case <-tick.C:
		}
	}
}
