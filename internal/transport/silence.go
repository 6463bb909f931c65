package transport

import (
	"context"
	"time"
)

// SilenceWatch tells when a peer falls silent at the transport level, and
// when it is heard from again (P4). It samples a count of received packets
// (quic.Conn.ConnectionStats().PacketsReceived): QUIC keep-alives make a
// healthy peer send something at least every Liveness.KeepAlive, so a count
// that stands still for Liveness.SuspectAfter means a dead process, a
// frozen one or a cut link, long before the heartbeat's verdict.
//
// Suspicion is advisory. The watch never closes anything; its owner stops
// sending new work and probes with a heartbeat, and the heartbeat decides
// the fence (R8, R9).
type SilenceWatch struct {
	// After is how long a silence makes the peer suspect.
	After time.Duration
	// Packets reads the count of packets received from the peer.
	Packets func() uint64
	// OnSuspect is called when the peer has been silent for After (silent
	// is how long exactly, as sampled). It runs on the watch's goroutine.
	OnSuspect func(silent time.Duration)
	// OnHeard is called when a suspect peer is heard from again.
	OnHeard func()
}

// Run samples the peer until ctx is done, a sixth of After apart: a
// silence is noticed within After plus one sample.
func (w *SilenceWatch) Run(ctx context.Context) {
	t := time.NewTicker(max(w.After/6, time.Millisecond))
	defer t.Stop()
	last, heardAt := w.Packets(), time.Now()
	suspect := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		if n := w.Packets(); n != last {
			last, heardAt = n, now
			if suspect {
				suspect = false
				w.OnHeard()
			}
			continue
		}
		if silent := now.Sub(heardAt); !suspect && silent >= w.After {
			suspect = true
			w.OnSuspect(silent)
		}
	}
}
