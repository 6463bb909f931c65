package dispatch

import (
	"context"
	"io"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// What the dispatcher needs of the scheduler and of the Node server, as
// interfaces: the loop is driven through them by a table test, and by
// SchedulerSlots and ServerNodes in the Edge.

// Slots hands out the right to run on a candidate (*sched.Scheduler,
// through SchedulerSlots).
type Slots interface {
	// Acquire returns a slot on the best candidate r admits, or waits for
	// one, as sched.Scheduler.Acquire does.
	Acquire(ctx context.Context, r sched.Request) (Slot, error)
	// Candidates lists every candidate now, as sched.Scheduler.Candidates.
	Candidates() []sched.Candidate
	// Matching lists the candidates now that match admits, and Any says
	// whether there is one, as sched.Scheduler's: what a request asks on
	// its way costs what serves it, not a copy of the fleet's list.
	Matching(match func(sched.Candidate) bool) []sched.Candidate
	Any(match func(sched.Candidate) bool) bool
	// MarkFull keeps c out of the picks until its Node reports a slot
	// free, or briefly: its Node refused work busy (sched.Scheduler.
	// MarkFull).
	MarkFull(c sched.Candidate)
}

// Slot is one granted slot (*sched.Slot).
type Slot interface {
	// Candidate is where the work runs.
	Candidate() sched.Candidate
	// Conn is the Node generation the slot is on.
	Conn() Conn
	// Release frees the slot; it is idempotent.
	Release()
}

// Conn is the Node generation a slot is on, as the dispatcher reads it
// (*fleet.Conn).
type Conn interface {
	Generation() uint64
	// Verified reports whether mutual TLS verified the Node's identity:
	// only such a Node is given a lease (S3).
	Verified() bool
	Identity() string
	// LeaseKey is the X25519 key the Node registered, leases are sealed
	// to.
	LeaseKey() []byte
	// AfterSuspect calls f once if the Node turns suspect (P4), until
	// stop is called.
	AfterSuspect(f func()) (stop func() bool)
}

// Nodes opens the streams of dispatched work (*nodeserver.Server, through
// ServerNodes). Each stream yields exactly one terminal: the Node's, or
// one the Edge makes when the stream ends without one.
type Nodes interface {
	Run(ctx context.Context, nodeID string, req *wirepb.RunRequest) (RunStream, error)
	Tunnel(ctx context.Context, nodeID string, req *wirepb.TunnelRequest, body io.Reader) (TunnelStream, error)
	Embed(ctx context.Context, nodeID string, req *wirepb.EmbedRequest) (EmbedStream, error)
	// Offers reports whether a provider of a Node the registry still holds
	// (in any state) offers a target match accepts.
	Offers(match func(sched.Candidate) bool) bool
	// Online lists the online providers of adapter on ready Nodes, for
	// the read-only calls of Metadata.
	Online(adapter string) []NodeProvider
}

// NodeProvider names one provider of one Node.
type NodeProvider struct{ NodeID, Provider string }

// Stream is what every dispatched stream can do before its first answer.
type Stream interface {
	// Abandon gives up the work while it has produced nothing (its Node
	// turned suspect): it ends as DISCONNECTED with cause, so that the
	// loop moves on. It reports false, and does nothing, once the work
	// produced something.
	Abandon(cause error) bool
	// Abandoned reports whether Abandon ended it.
	Abandoned() bool
}

// RunStream is a dispatched run (*nodeserver.RunStream).
type RunStream interface {
	Stream
	// Next returns the next event; after the terminal, io.EOF.
	Next() (*wirepb.RunEvent, error)
	// Ready reports whether Next returns without waiting.
	Ready() bool
	// Close cancels the run on the Node if it has not ended.
	Close()
}

// TunnelStream is a dispatched raw tunnel (*nodeserver.TunnelStream).
type TunnelStream interface {
	Stream
	// Head waits for the provider's response head; an error is a
	// *nodeserver.TunnelError, or the dispatch's.
	Head() (*wirepb.TunnelResponseHead, error)
	// Read reads the body: io.EOF at a completed end, a
	// *nodeserver.TunnelError otherwise.
	Read(p []byte) (int, error)
	// NextPiece is Read without a copy: the next piece of the body whole, as
	// the Node sent it, the caller's to keep. It ends as Read does.
	NextPiece() ([]byte, error)
	// Ready reports whether Read returns more without waiting.
	Ready() bool
	// Terminal is the tunnel's single outcome, once Read returned an
	// error.
	Terminal() *wirepb.TunnelTerminal
	// Close cancels the tunnel on the Node if it has not ended.
	Close()
}

// EmbedStream is a dispatched embedding call (*nodeserver.EmbedStream).
type EmbedStream interface {
	Stream
	// Wait reads the call to its end: its vectors (with a COMPLETED
	// terminal only) and its terminal; progress after each frame.
	Wait(progress func()) ([]*wirepb.Vector, *wirepb.RunEvent)
}

// SchedulerSlots adapts s to Slots.
func SchedulerSlots(s *sched.Scheduler) Slots { return schedulerSlots{s} }

type schedulerSlots struct{ s *sched.Scheduler }

func (s schedulerSlots) Acquire(ctx context.Context, r sched.Request) (Slot, error) {
	slot, err := s.s.Acquire(ctx, r)
	if err != nil {
		return nil, err
	}
	return schedulerSlot{slot}, nil
}

func (s schedulerSlots) Candidates() []sched.Candidate { return s.s.Candidates() }
func (s schedulerSlots) Matching(match func(sched.Candidate) bool) []sched.Candidate {
	return s.s.Matching(match)
}
func (s schedulerSlots) Any(match func(sched.Candidate) bool) bool { return s.s.Any(match) }
func (s schedulerSlots) MarkFull(c sched.Candidate)                { s.s.MarkFull(c) }

type schedulerSlot struct{ s *sched.Slot }

func (s schedulerSlot) Candidate() sched.Candidate { return s.s.Candidate }
func (s schedulerSlot) Conn() Conn                 { return s.s.Conn() }
func (s schedulerSlot) Release()                   { s.s.Release() }

var _ Conn = (*fleet.Conn)(nil)

// ServerNodes adapts srv to Nodes.
func ServerNodes(srv *nodeserver.Server) Nodes { return serverNodes{srv} }

type serverNodes struct{ srv *nodeserver.Server }

func (n serverNodes) Run(ctx context.Context, nodeID string, req *wirepb.RunRequest) (RunStream, error) {
	rs, err := n.srv.Run(ctx, nodeID, req)
	if err != nil {
		return nil, err
	}
	return rs, nil
}

func (n serverNodes) Tunnel(ctx context.Context, nodeID string, req *wirepb.TunnelRequest, body io.Reader) (TunnelStream, error) {
	ts, err := n.srv.Tunnel(ctx, nodeID, req, body)
	if err != nil {
		return nil, err
	}
	return ts, nil
}

func (n serverNodes) Embed(ctx context.Context, nodeID string, req *wirepb.EmbedRequest) (EmbedStream, error) {
	es, err := n.srv.Embed(ctx, nodeID, req)
	if err != nil {
		return nil, err
	}
	return es, nil
}

func (n serverNodes) Offers(match func(sched.Candidate) bool) bool {
	return n.srv.Registry().Offers(func(nodeID, provider, adapter, target string) bool {
		return match(sched.Candidate{NodeID: nodeID, Provider: provider, Adapter: adapter, Target: target})
	})
}

func (n serverNodes) Online(adapter string) []NodeProvider {
	var out []NodeProvider
	for _, c := range n.srv.Registry().Ready() {
		for _, p := range c.Providers() {
			if p.GetAdapter() == adapter && p.GetState() == wirepb.ProviderState_PROVIDER_STATE_ONLINE {
				out = append(out, NodeProvider{c.NodeID(), p.GetName()})
			}
		}
	}
	return out
}
