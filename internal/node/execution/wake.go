package execution

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Wake on demand (issue 23): a Node may list machines on its LAN that it
// can wake (nodeconfig.Wake). It tells the Edge at registration
// (RegisterRequest.wake_targets), and the Edge, needing a model that only
// a sleeping Node served, sends it COMMAND_KIND_WAKE naming that Node. The
// Node then sends the wake-on-LAN magic packet: one UDP datagram to the
// LAN's broadcast address. That is all a Node does; whether the machine
// woke, the Edge learns when its Node registers.

// WakeTarget is a machine this Node can wake.
type WakeTarget struct {
	// NodeID is the Node that runs there.
	NodeID string
	// MAC is its network card's address, six bytes.
	MAC net.HardwareAddr
	// Addr is where the packet goes, host:port (the LAN's broadcast
	// address, port 9 by default).
	Addr string
}

// Wire is the target as the Node registers it.
func (t WakeTarget) Wire() *wirepb.WakeTarget {
	return &wirepb.WakeTarget{NodeId: t.NodeID, Mac: t.MAC.String(), Broadcast: t.Addr}
}

// WakeTargetsWire lists targets as the Node registers them.
func WakeTargetsWire(targets []WakeTarget) []*wirepb.WakeTarget {
	out := make([]*wirepb.WakeTarget, 0, len(targets))
	for _, t := range targets {
		out = append(out, t.Wire())
	}
	return out
}

// MagicPacket is the wake-on-LAN payload for mac: six 0xFF bytes, then the
// six-byte MAC sixteen times (102 bytes). A sleeping card that sees it
// anywhere in a frame wakes its machine.
func MagicPacket(mac net.HardwareAddr) []byte {
	p := make([]byte, 0, 6+16*len(mac))
	p = append(p, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	for range 16 {
		p = append(p, mac...)
	}
	return p
}

// ErrNotWakeTarget: the Node asked to wake is not one this Node lists.
var ErrNotWakeTarget = errors.New("not a wake target of this node")

// wakeSendTimeout bounds one wake: resolving the broadcast host and one
// datagram.
const wakeSendTimeout = 5 * time.Second

// Waker sends magic packets to the Node's wake targets. Its zero value
// (and nil) has no targets.
type Waker struct {
	targets []WakeTarget
	log     *slog.Logger
	// send sends one datagram to addr; sendUDP, or a test's.
	send func(ctx context.Context, addr string, payload []byte) error
}

// NewWaker returns a waker for targets; log logs each packet sent.
func NewWaker(targets []WakeTarget, log *slog.Logger) *Waker {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Waker{targets: slices.Clone(targets), log: log, send: sendUDP}
}

// Targets are the machines the waker can wake.
func (w *Waker) Targets() []WakeTarget {
	if w == nil {
		return nil
	}
	return slices.Clone(w.targets)
}

// Wake sends the magic packet for nodeID's machine. It fails with
// ErrNotWakeTarget for a Node this one does not list, and with the
// network's error when the packet cannot be sent (no route to the
// broadcast address, a host name that does not resolve).
func (w *Waker) Wake(ctx context.Context, nodeID string) error {
	var names []string
	for _, t := range w.Targets() {
		if t.NodeID != nodeID {
			names = append(names, t.NodeID)
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, wakeSendTimeout)
		defer cancel()
		if err := w.send(ctx, t.Addr, MagicPacket(t.MAC)); err != nil {
			return fmt.Errorf("wake node %q: send the magic packet for %s to %s: %w", nodeID, t.MAC, t.Addr, err)
		}
		w.log.Info("sent a wake-on-LAN packet", "wake_node", nodeID, "mac", t.MAC.String(), "to", t.Addr)
		return nil
	}
	listed := "none"
	if len(names) > 0 {
		listed = strings.Join(names, ", ")
	}
	return fmt.Errorf("%w: node %q (this node's wake list: %s)", ErrNotWakeTarget, nodeID, listed)
}

// sendUDP sends payload to addr over UDP/IPv4. Go sets SO_BROADCAST on
// every IPv4 datagram socket it opens, so addr may be a broadcast address.
func sendUDP(ctx context.Context, addr string, payload []byte) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp4", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetWriteDeadline(dl)
	}
	_, err = c.Write(payload)
	return err
}

// wake answers COMMAND_KIND_WAKE into res: nothing on success, a Failure
// that names the Node and the reason otherwise.
func (h *Handler) wake(c *wirepb.CommandRequest, res *wirepb.CommandResult) {
	err := h.waker.Wake(context.Background(), c.GetWakeNodeId())
	switch {
	case err == nil:
	case errors.Is(err, ErrNotWakeTarget):
		res.Failure = &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST, Message: err.Error()}
	default:
		h.log.Warn("wake-on-LAN packet not sent", "wake_node", c.GetWakeNodeId(), "err", err)
		res.Failure = &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_INTERNAL, Message: err.Error()}
	}
}
