package frontend

import (
	"context"
	"log/slog"
	"strconv"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Dispatcher is what the front end asks of the dispatcher
// (*dispatch.Dispatcher, through FromDispatcher); the APIs' tests fake it
// once (frontendtest).
type Dispatcher interface {
	// Resolve finds what model resolves to for p: its plan, once per
	// request; an error wrapping dispatch.ErrForbidden when p may not use
	// it.
	Resolve(p auth.Principal, model string) (dispatch.Plan, error)
	// StartRun dispatches req under plan, as dispatch.Dispatcher.StartRun.
	StartRun(ctx context.Context, plan *dispatch.Plan, req *wirepb.RunRequest, watch dispatch.Watch) (Run, error)
	// StartTunnel relays req, as dispatch.Dispatcher.StartTunnel.
	StartTunnel(ctx context.Context, plan *dispatch.Plan, req *wirepb.TunnelRequest, body dispatch.TunnelBody, watch dispatch.Watch) (Tunnel, error)
	// Embed computes req's embeddings, as dispatch.Dispatcher.Embed.
	Embed(ctx context.Context, plan *dispatch.Plan, req *wirepb.EmbedRequest, watch dispatch.Watch, progress func()) (*dispatch.Embedding, error)
	// Candidates are the candidates that can serve plan now.
	Candidates(plan dispatch.Plan) []sched.Candidate
	// Available is nil when work of plan can be scheduled now, otherwise
	// why not.
	Available(plan dispatch.Plan) error
	// Ready is Available for a call that may wait: a model that only a
	// sleeping Node served is woken first, as dispatch.Dispatcher.Ready.
	Ready(ctx context.Context, plan dispatch.Plan) error
	// Inventory is what p may ask for and can be served now (SPEC P1).
	Inventory(p auth.Principal) []dispatch.Offering
	// Metadata sends one read-only call to every ready Node's online
	// providers of adapter, and returns every answer.
	Metadata(ctx context.Context, adapter, method, path string, maxBody int64) []dispatch.MetadataReply
}

// Run is a normalized run in progress (*dispatch.Run): Next yields events
// until exactly one terminal, then io.EOF.
type Run interface {
	ID() string
	Node() sched.Candidate
	Next() (*wirepb.RunEvent, error)
	// Ready reports whether Next returns without waiting.
	Ready() bool
	Work
	// Close releases the run, cancelling it if it has not ended. Safe to
	// call more than once.
	Close()
}

// Tunnel is a raw provider request in progress (*dispatch.Tunnel): Head
// is known when it starts; NextPiece yields the body until io.EOF (a completed
// terminal) or another error (any other terminal).
type Tunnel interface {
	ID() string
	Node() sched.Candidate
	Head() *wirepb.TunnelResponseHead
	// NextPiece returns the next piece of the body as the Node sent it (what
	// the provider flushed together), the caller's to keep: io.EOF at a
	// completed end, the tunnel's error otherwise.
	NextPiece() ([]byte, error)
	// Ready reports whether NextPiece returns more without waiting.
	Ready() bool
	Work
	// Close releases the tunnel, cancelling it if it has not ended.
	Close()
	// CountUsage counts the tokens the completed answer reported.
	CountUsage(prompt, completion int64)
}

// FromDispatcher is d as the front end's Dispatcher.
func FromDispatcher(d *dispatch.Dispatcher) Dispatcher { return dispatcher{d} }

// dispatcher gives *dispatch.Dispatcher's starts the front end's
// interfaces as results (Go has no covariant results).
type dispatcher struct{ *dispatch.Dispatcher }

func (d dispatcher) StartRun(ctx context.Context, plan *dispatch.Plan, req *wirepb.RunRequest, watch dispatch.Watch) (Run, error) {
	r, err := d.Dispatcher.StartRun(ctx, plan, req, watch)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (d dispatcher) StartTunnel(ctx context.Context, plan *dispatch.Plan, req *wirepb.TunnelRequest, body dispatch.TunnelBody, watch dispatch.Watch) (Tunnel, error) {
	t, err := d.Dispatcher.StartTunnel(ctx, plan, req, body, watch)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Logger is the front end's log, for what an API logs beside the
// requests' own lines.
func (f *Front) Logger() *slog.Logger { return f.log }

// Dispatcher is the dispatcher the front end runs work with (for the APIs'
// model lists and metadata).
func (f *Front) Dispatcher() Dispatcher { return f.d }

// AppendValues appends v's values to b as a JSON array of numbers, each
// the shortest text that reads back as the same float32: what the
// embedding answers of every API are made of. The values are finite (the
// transport refuses others).
func AppendValues(b []byte, v *wirepb.Vector) []byte {
	b = append(b, '[')
	for i, f := range v.GetValues() {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendFloat(b, float64(f), 'g', -1, 32)
	}
	return append(b, ']')
}
