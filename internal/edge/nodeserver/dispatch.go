package nodeserver

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/transport"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Dispatched is a stream the Edge opened to a Node for one run, tunnel or
// command. When the Node's generation is fenced, its reads and writes fail
// with an error that matches quicwire.ErrDisconnected: the disconnect
// outcome of R9.
//
// The caller must end every Dispatched with Finish (after reading its
// outcome) or Cancel: both halves of the stream are then finished, and a
// draining Node's connection can close once all of them are.
type Dispatched struct {
	*transport.Stream
	// Conn is the generation the stream was opened on.
	Conn *fleet.Conn
	srv  *Server
	done sync.Once
}

// observe hands a stall observation that came on this stream to the
// registry's health overlay (R6, R7), which ignores a stale one.
func (d *Dispatched) observe(o *wirepb.StallObservation) {
	if o == nil {
		return
	}
	if err := d.srv.reg.ObserveStall(d.Conn, o); err != nil {
		d.srv.log.Info("stall observation ignored", "node", d.Conn.NodeID(), "err", err)
		return
	}
	d.srv.log.Warn("response stalled", "node", o.GetNodeId(), "generation", o.GetGeneration(),
		"provider", o.GetProvider(), "target", o.GetTarget(), "health", o.GetProviderHealth(),
		"classification", o.GetLivenessClassification(), "seq", o.GetHealthObservationSeq(),
		"since_last_progress_ms", o.GetSinceLastProgressMs(), "close_confirmed", o.GetCloseConfirmed())
}

// Finish ends the stream after its outcome was read: this side's half is
// closed and nothing more is read.
func (d *Dispatched) Finish() {
	d.done.Do(func() {
		_ = d.CloseSend()
		d.StopReading()
		d.Conn.StreamDone()
	})
}

// Cancel abandons the stream with code (R10: the work on it is cancelled).
func (d *Dispatched) Cancel(code quicwire.StreamCode) {
	d.Stream.Cancel(code)
	d.done.Do(d.Conn.StreamDone)
}

// ErrStreamWait is a dispatch that found every stream its Node's
// connection accepts in use for Options.StreamWait. The scheduler grants no
// more slots on a generation than its stream limit has room for
// (fleet.Conn.Slots), so this is rare: metadata calls and streams still
// closing took the headroom. The work may move to another candidate.
var ErrStreamWait = fleet.ErrStreamWait // a dispatch waited Options.StreamWait

// Dispatch opens a stream to nodeID's current generation, which must be
// ready and not suspect (R1, P4), and sends hdr as its first frame, stamped
// with that generation. When the Node's stream limit is reached it waits
// for a free stream, until ctx is done or for at most Options.StreamWait,
// and then fails with ErrStreamWait.
//
// Frames in then follow the header in the same write, so a request and a
// body that fits leave in one packet. A header past one frame travels in
// parts, within what the Node takes (fleet.Conn.MaxRequest): past that it
// is refused with an error that matches transport.ErrHeaderTooLarge, which
// the dispatcher's candidate filter makes rare (sched.Candidate.MaxRequest).
func (s *Server) Dispatch(ctx context.Context, nodeID string, hdr *wirepb.StreamHeader, then ...proto.Message) (*Dispatched, error) {
	conn, err := s.reg.Dispatchable(nodeID)
	if err != nil {
		return nil, err
	}
	st, err := conn.OpenStream(ctx, s.opts.StreamWait)
	if err != nil {
		if cc, ok := quicwire.CloseReason(err); ok {
			return nil, fmt.Errorf("dispatch to %s: %w", nodeID, cc)
		}
		if ctx.Err() == nil && errors.Is(err, ErrStreamWait) {
			s.log.Warn("no stream free on a node's connection", "node", nodeID, "generation", conn.Generation(), "waited", s.opts.StreamWait)
			return nil, fmt.Errorf("dispatch to %s: %w (waited %v)", nodeID, ErrStreamWait, s.opts.StreamWait)
		}
		return nil, fmt.Errorf("dispatch to %s: open stream: %w", nodeID, err)
	}
	hdr.Generation = conn.Generation()
	conn.StreamOpened()
	d := &Dispatched{Stream: transport.NewStream(st, transport.HeaderKind(hdr)), Conn: conn, srv: s}
	if err := d.SendHeader(hdr, conn.MaxRequest(), then...); err != nil {
		d.Cancel(quicwire.StreamCancelled)
		return nil, fmt.Errorf("dispatch to %s: %w", nodeID, err)
	}
	return d, nil
}
