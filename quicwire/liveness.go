package quicwire

import (
	"errors"
	"fmt"
	"time"
)

// Liveness is a liveness profile: how often each side sends a heartbeat on
// the control stream, and how long it waits for the answer before it closes
// the connection with CloseHeartbeatTimeout (R8, R9).
//
// These are transport constants, not protobuf fields and not model
// settings. A long prefill (minutes without a byte) or streaming
// backpressure never trips them: heartbeats flow on their own stream with
// their own flow-control credit (see QUICConfig).
type Liveness struct {
	// Interval between heartbeats sent by one side.
	Interval time.Duration
	// ResponseWait is how long a heartbeat may stay unanswered.
	ResponseWait time.Duration
}

// DefaultLiveness is the profile both daemons run: a 30 s interval and a
// 45 s response wait.
var DefaultLiveness = Liveness{Interval: 30 * time.Second, ResponseWait: 45 * time.Second}

// Scaled divides both durations by div, for tests that cannot use a fake
// clock (real sockets). Daemons scale only under edged's hidden
// --test-liveness-divisor, for tests of the real binary.
func (l Liveness) Scaled(div int) Liveness {
	if div <= 1 {
		return l
	}
	return Liveness{Interval: l.Interval / time.Duration(div), ResponseWait: l.ResponseWait / time.Duration(div)}
}

// Validate reports a profile that cannot work.
func (l Liveness) Validate() error {
	if l.Interval <= 0 || l.ResponseWait <= 0 {
		return errors.New("liveness: interval and response wait must be positive")
	}
	if l.ResponseWait < l.Interval {
		return fmt.Errorf("liveness: response wait %v is shorter than the interval %v", l.ResponseWait, l.Interval)
	}
	return nil
}

// SuspectAfter is how long a peer may go unheard at the transport level (no
// QUIC packet at all: no data, no ACK, no keep-alive) before it is suspect
// (P4): a quarter of the response wait, at most 6 s. Suspicion is not the
// verdict: the heartbeat still decides the fence and names its reason (R8,
// R9). It only stops new work from going to a peer that has fallen silent,
// and makes the suspecting side send a heartbeat at once (Heartbeat.Probe),
// so that the verdict comes one response wait after the silence began
// rather than up to an interval later.
func (l Liveness) SuspectAfter() time.Duration {
	return min(6*time.Second, l.ResponseWait/4)
}

// KeepAlive is the QUIC keep-alive period: a third of SuspectAfter (2 s in
// the default profile). quic-go sends a PING when it has received nothing
// for this long, and the peer ACKs it, so on a healthy link each side hears
// from the other at least this often, even when no stream carries data: a
// silence of SuspectAfter is then three keep-alives missed, not an idle
// link. It is also far below common NAT binding timeouts, so an idle Node
// stays reachable.
func (l Liveness) KeepAlive() time.Duration {
	return l.SuspectAfter() / 3
}

// NodeKeepAlive is the Node's QUIC keep-alive period: half of KeepAlive (1 s
// in the default profile). quic-go sends its PING after that long without
// receiving anything, so an idle Node is the side that pings, once a
// second, and the Edge's answer keeps the Edge from pinging at all. It is
// shorter than the Edge's so that an idle Node notices a restarted Edge
// (its PING unanswered for UnansweredAfter) within about two seconds of the
// restart: the next PING, then the probe and the fresh connection's
// handshake (issue 26). The cost is one small packet a second each way
// per idle Node.
func (l Liveness) NodeKeepAlive() time.Duration {
	return l.KeepAlive() / 2
}

// UnansweredAfter is how long what a Node sent may go without any packet
// back before it asks (a heartbeat sent at once, Heartbeat.Probe), and how
// long that probe may then go without any packet back before the Node
// dials a fresh connection beside the old one, and how long a fresh
// connection that completed its handshake waits for the old to be heard
// from at all: a quarter of a keep-alive (500 ms in the default profile). A live peer acknowledges an ack-eliciting packet
// within a round trip plus its ACK delay (25 ms), so a second with nothing
// at all is a peer that is gone (a restarted Edge whose resets the Node
// cannot recognise) or a link that is down, not a slow one. It only starts
// the fresh dial; neither connection is trusted until it proves itself.
func (l Liveness) UnansweredAfter() time.Duration {
	return l.KeepAlive() / 4
}

// ResumeGrace is how long a Node whose fresh connection has completed its
// handshake holds it back while the old connection, heard from again after
// a silence, may still prove itself with an answered heartbeat: half of
// SuspectAfter (3 s in the default profile). An old connection that resumes
// within it keeps its streams; one whose sender is still backing off its
// retransmissions is replaced when it runs out.
func (l Liveness) ResumeGrace() time.Duration {
	return l.SuspectAfter() / 2
}

// IdleTimeout is the QUIC idle timeout. The worst case for the heartbeat to
// notice a dead peer is one interval (the ping goes out just after the peer
// died) plus the response wait; the idle timeout sits above that, so the
// application heartbeat, not QUIC, decides liveness and names the reason.
func (l Liveness) IdleTimeout() time.Duration {
	return l.Interval + l.ResponseWait + l.Interval/2
}
