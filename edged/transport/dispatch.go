package transport

import (
	"context"
	"fmt"

	"github.com/iop-dev/iop/edged/nodes"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Dispatched is a stream the Edge opened to a Node for one run, tunnel or
// command. When the Node's generation is fenced, its reads and writes fail
// with an error that matches quicwire.ErrDisconnected: the disconnect
// outcome of R9.
type Dispatched struct {
	*quicwire.Stream
	// Conn is the generation the stream was opened on.
	Conn *nodes.Conn
}

// Dispatch opens a stream to nodeID's current generation, which must be
// ready (R1), and sends hdr as its first frame, stamped with that
// generation. It waits for a free stream slot (quicwire.MaxDispatchedStreams
// per connection) until ctx is done.
func (s *Server) Dispatch(ctx context.Context, nodeID string, hdr *wirepb.StreamHeader) (*Dispatched, error) {
	conn, err := s.reg.Dispatchable(nodeID)
	if err != nil {
		return nil, err
	}
	st, err := conn.OpenStream(ctx)
	if err != nil {
		if cc, ok := quicwire.CloseReason(err); ok {
			return nil, fmt.Errorf("dispatch to %s: %w", nodeID, cc)
		}
		return nil, fmt.Errorf("dispatch to %s: open stream: %w", nodeID, err)
	}
	hdr.Generation = conn.Generation()
	ds := quicwire.NewStream(st, quicwire.HeaderKind(hdr))
	if err := ds.Send(hdr); err != nil {
		ds.Cancel(quicwire.StreamCancelled)
		return nil, fmt.Errorf("dispatch to %s: %w", nodeID, err)
	}
	return &Dispatched{Stream: ds, Conn: conn}, nil
}
