package nodeserver

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Several Edges (issue 22): every Node keeps a connection to every Edge of
// the cluster. An Edge tells each Node the cluster's Edge list at
// registration (RegisterResponse.cluster_edges) and again at every change
// (ClusterUpdate), and tells it when it is itself stopping (EdgeStopping).
// Each Edge dispatches only over its own connection to the Node; nothing
// travels between Edges here.

// Edge is one Edge of the cluster as its Nodes are told of it.
type Edge struct {
	// ID is the Edge's id, the one its certificate names.
	ID string
	// QUICAddr is the host:port Nodes dial for its QUIC listener (the
	// Edge's advertised address, not necessarily its listen address).
	QUICAddr string
	// Stopping: the Edge is stopping; Nodes do not dial it anew.
	Stopping bool
}

// EdgeDirectory is the source of the cluster's Edge list (the cluster
// registry over PostgreSQL implements it). Edges lists every Edge,
// this one included; Changed returns a channel closed at the next change
// of Edges.
type EdgeDirectory interface {
	Edges() []Edge
	Changed() <-chan struct{}
}

// Stopping tells every connected Node, and every Node that registers from
// now on, that this Edge is stopping (EdgeStopping), with reason: they
// serve new work through their other Edges while the streams in flight
// here finish. The Edge's own entry in the lists it sends is marked
// stopping too. The lead calls it on SIGTERM, before it waits for its
// streams and then calls Shutdown. Later calls do nothing.
func (s *Server) Stopping(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopReason != "" {
		return
	}
	if reason == "" {
		reason = "edge stopping"
	}
	s.stopReason = reason
	close(s.stopping)
	s.log.Info("edge stopping: telling its nodes", "reason", reason, "nodes", len(s.conns))
}

// stopped returns the reason given to Stopping, if it was called.
func (s *Server) stopped() (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopReason, s.stopReason != ""
}

// clusterEdges is the Edge list as a Node is told it: the directory's,
// with this Edge marked stopping once Stopping was called. Nil without a
// directory: the Node keeps its configured addresses.
func (s *Server) clusterEdges() []*wirepb.ClusterEdge {
	dir := s.opts.Directory
	if dir == nil {
		return nil
	}
	_, stopping := s.stopped()
	edges := dir.Edges()
	out := make([]*wirepb.ClusterEdge, 0, len(edges))
	for _, e := range edges {
		out = append(out, &wirepb.ClusterEdge{
			EdgeId:      e.ID,
			QuicAddress: e.QUICAddr,
			Stopping:    e.Stopping || (stopping && e.ID == s.opts.EdgeID),
		})
	}
	return out
}

// sameEdges reports whether two lists say the same.
func sameEdges(a, b []*wirepb.ClusterEdge) bool {
	return slices.EqualFunc(a, b, func(x, y *wirepb.ClusterEdge) bool {
		return x.GetEdgeId() == y.GetEdgeId() && x.GetQuicAddress() == y.GetQuicAddress() && x.GetStopping() == y.GetStopping()
	})
}

// tellCluster keeps a cluster-aware Node told of the cluster until ctx
// ends: a ClusterUpdate at every change of the Edge list after sent (the
// list its RegisterResponse carried), and EdgeStopping once this Edge is
// stopping (at once if it already is).
func (c *nodeConn) tellCluster(ctx context.Context, sent []*wirepb.ClusterEdge) {
	s := c.srv
	var changed <-chan struct{}
	if s.opts.Directory != nil {
		changed = s.opts.Directory.Changed()
	}
	stopping := s.stopping
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			changed = s.opts.Directory.Changed()
		case <-stopping:
			stopping = nil
			reason, _ := s.stopped()
			if err := c.cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_EdgeStopping{EdgeStopping: &wirepb.EdgeStopping{Reason: reason}}}); err != nil {
				return
			}
			c.log.Info("told the node this edge is stopping")
		}
		// A list is sent whenever it differs from the last sent: the
		// directory's change, or this Edge's own stop marking it.
		edges := s.clusterEdges()
		if changed == nil && stopping == nil && edges == nil {
			// No directory, and the stop already told: nothing more
			// will ever change.
			<-ctx.Done()
			return
		}
		if edges == nil || sameEdges(edges, sent) {
			continue
		}
		if err := c.cs.Send(&wirepb.ControlFrame{Msg: &wirepb.ControlFrame_ClusterUpdate{ClusterUpdate: &wirepb.ClusterUpdate{Edges: edges}}}); err != nil {
			return
		}
		sent = edges
		c.log.Debug("cluster edge list sent", "edges", len(edges))
	}
}

// BusyReason is Failure.reason of the terminal the Edge makes for a Node's
// StreamBusy refusal: a CAPACITY_EXHAUSTED failure, retryable, which the
// dispatcher treats as a refusal before the first byte (the Node's slots
// are taken, by this Edge or another of the cluster).
const BusyReason = "node_busy"

// busy reports whether err is the Node's StreamBusy refusal of a stream.
func busy(err error) bool {
	var sc *quicwire.StreamCancelledError
	return errors.As(err, &sc) && sc.Remote && sc.Code == quicwire.StreamBusy
}

// busyFailure is the failure of a stream the Node refused busy.
func (d *Dispatched) busyFailure() *wirepb.Failure {
	d.srv.busyRefusals.Add(1)
	return &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED, Reason: BusyReason, Retryable: true,
		Message: fmt.Sprintf("node %s refused the stream: every slot of the provider is taken (by this or another Edge)", d.Conn.NodeID())}
}

// BusyRefusals counts the streams Nodes refused busy on this Edge.
func (s *Server) BusyRefusals() int64 { return s.busyRefusals.Load() }
