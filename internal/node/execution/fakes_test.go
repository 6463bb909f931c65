package execution

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// fakeStream is an in-memory run stream: what the Node sends is recorded;
// cancel() makes the Edge's side look reset.
type fakeStream struct {
	mu        sync.Mutex
	sent      []*wirepb.RunEvent
	frames    []*wirepb.EmbedFrame // of an embed stream
	cancelled chan struct{}
	once      sync.Once
}

func newFakeStream() *fakeStream { return &fakeStream{cancelled: make(chan struct{})} }

func (f *fakeStream) Send(m proto.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.cancelled:
		return &quicwire.StreamCancelledError{Code: quicwire.StreamCancelled, Remote: true}
	default:
	}
	if ef, ok := m.(*wirepb.EmbedFrame); ok {
		f.frames = append(f.frames, proto.CloneOf(ef))
		return nil
	}
	f.sent = append(f.sent, proto.Clone(m).(*wirepb.RunEvent))
	return nil
}

func (f *fakeStream) embedFrames() []*wirepb.EmbedFrame {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*wirepb.EmbedFrame(nil), f.frames...)
}

func (f *fakeStream) Recv(proto.Message) error {
	<-f.cancelled
	return &quicwire.StreamCancelledError{Code: quicwire.StreamCancelled, Remote: true}
}

func (f *fakeStream) cancel() { f.once.Do(func() { close(f.cancelled) }) }

func (f *fakeStream) events() []*wirepb.RunEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*wirepb.RunEvent(nil), f.sent...)
}

// fakePlugin runs exec for each Execute, and embed, if set, for each
// Embed.
type fakePlugin struct {
	exec     func(ctx context.Context, req *wirepb.RunRequest, emit func(*wirepb.RunEvent) error) (*sdk.Result, error)
	embed    func(ctx context.Context, req *wirepb.EmbedRequest, emit func(*wirepb.EmbedVectors) error) (*sdk.Usage, error)
	calls    atomic.Int32
	exited   chan struct{}
	exitOnce sync.Once
	closed   atomic.Bool
	// probe, if set, answers Probe; probes counts the calls.
	probe  func(ctx context.Context, target string) (sdk.Health, error)
	probes atomic.Int32
	// caps are the capabilities it reports; list, if set, answers
	// ListTargets and lists counts the calls.
	caps  []string
	list  func(ctx context.Context) ([]sdk.Target, error)
	lists atomic.Int32
	// creds are the credentials Execute was given ("" for none), and
	// leases the sealed leases its requests still carried.
	credMu sync.Mutex
	creds  []string
	leases int
}

func (p *fakePlugin) credentials() ([]string, int) {
	p.credMu.Lock()
	defer p.credMu.Unlock()
	return append([]string(nil), p.creds...), p.leases
}

func newFakePlugin(exec func(ctx context.Context, req *wirepb.RunRequest, emit func(*wirepb.RunEvent) error) (*sdk.Result, error)) *fakePlugin {
	return &fakePlugin{exec: exec, exited: make(chan struct{})}
}

func (p *fakePlugin) Capabilities() []string                      { return p.caps }
func (p *fakePlugin) Configure(context.Context, sdk.Config) error { return nil }
func (p *fakePlugin) Execute(ctx context.Context, req *wirepb.RunRequest, cred *sdk.Credential, emit func(*wirepb.RunEvent) error) (*wirepb.RunEvent, error) {
	p.calls.Add(1)
	p.credMu.Lock()
	secret := ""
	if cred != nil {
		secret = cred.Secret
	}
	p.creds = append(p.creds, secret)
	if len(req.GetSealedLease()) > 0 {
		p.leases++
	}
	p.credMu.Unlock()
	res, err := p.exec(ctx, req, emit)
	return terminalOf(res, err)
}

// terminalOf is the terminal a plugin returns for an adapter's result (its
// errors are left for the execution side to turn into a failure, as the host's are).
func terminalOf(res *sdk.Result, err error) (*wirepb.RunEvent, error) {
	if err != nil {
		return nil, err
	}
	ev := &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED}
	if res != nil {
		ev.DoneReason = res.DoneReason
		if u := res.Usage; u != nil { // the token counts are all these tests use
			ev.Usage = &wirepb.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens}
		}
	}
	return ev, nil
}
func (p *fakePlugin) ListTargets(ctx context.Context) ([]sdk.Target, error) {
	p.lists.Add(1)
	if p.list != nil {
		return p.list(ctx)
	}
	return nil, sdk.ErrUnsupported
}
func (p *fakePlugin) Probe(ctx context.Context, target string) (sdk.Health, error) {
	p.probes.Add(1)
	if p.probe != nil {
		return p.probe(ctx, target)
	}
	return sdk.Health{}, sdk.ErrUnsupported
}
func (p *fakePlugin) Tunnel(context.Context, *wirepb.TunnelRequest, *sdk.Credential, io.Reader, func(*wirepb.TunnelFrame) error) error {
	return sdk.ErrUnsupported
}
func (p *fakePlugin) TunnelRoute(context.Context) (*sdk.TunnelRoute, error) {
	return nil, sdk.ErrUnsupported
}
func (p *fakePlugin) Embed(ctx context.Context, req *wirepb.EmbedRequest, cred *sdk.Credential, emit func(*wirepb.EmbedVectors) error) (*wirepb.RunEvent, error) {
	p.calls.Add(1)
	p.credMu.Lock()
	if cred != nil {
		p.creds = append(p.creds, cred.Secret)
	}
	if len(req.GetSealedLease()) > 0 {
		p.leases++
	}
	p.credMu.Unlock()
	if p.embed == nil {
		return nil, sdk.ErrUnsupported
	}
	usage, err := p.embed(ctx, req, emit)
	return terminalOf(&sdk.Result{Usage: usage}, err)
}
func (p *fakePlugin) Close(context.Context) error { p.closed.Store(true); p.exit(); return nil }
func (p *fakePlugin) Exited() <-chan struct{}     { return p.exited }
func (p *fakePlugin) exit()                       { p.exitOnce.Do(func() { close(p.exited) }) }

var errTest = errors.New("test")

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
