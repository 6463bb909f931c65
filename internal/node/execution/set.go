package execution

import (
	"context"
	"fmt"
	"sync"

	"github.com/iop-dev/iop/internal/node/edgeclient"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Set is the Node's providers. It implements edgeclient.Providers: the
// ready handshake waits until every provider has had its first start
// attempt, and every state change is reported to the Edge.
type Set struct {
	providers []*Provider

	mu      sync.Mutex
	changed chan struct{}
	wg      sync.WaitGroup
	cancel  context.CancelFunc
}

var _ edgeclient.Providers = (*Set)(nil)

// NewSet returns an empty set; add providers with Add before Start.
func NewSet() *Set { return &Set{changed: make(chan struct{})} }

// Notify broadcasts a change; providers call it.
func (s *Set) Notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.changed)
	s.changed = make(chan struct{})
}

// Add adds a provider.
func (s *Set) Add(p *Provider) { s.providers = append(s.providers, p) }

// Providers returns the providers, in configuration order.
func (s *Set) Providers() []*Provider { return s.providers }

// Start supervises every provider until Stop.
func (s *Set) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for _, p := range s.providers {
		s.wg.Go(func() { p.Supervise(ctx) })
	}
}

// Stop stops every plugin and waits for them.
func (s *Set) Stop() {
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
}

// Snapshot implements edgeclient.Providers.
func (s *Set) Snapshot() []*wirepb.Provider {
	out := make([]*wirepb.Provider, 0, len(s.providers))
	for _, p := range s.providers {
		out = append(out, p.Wire())
	}
	return out
}

// WaitReady implements edgeclient.Providers: it returns once every provider
// has come up or failed its first start, so one broken provider does not
// keep the others from serving. A provider whose model server does not
// answer at start has come up (offline, listing until it answers): its
// first listing is bounded by Supervision.ListTimeout.
func (s *Set) WaitReady(ctx context.Context) error {
	for _, p := range s.providers {
		select {
		case <-p.attempted:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Changed implements edgeclient.Providers.
func (s *Set) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Lookup selects the provider for a run: by name when given, else the
// first whose adapter (if given) matches and that serves target.
func (s *Set) Lookup(name, adapter, target string) (*Provider, error) {
	for _, p := range s.providers {
		if name != "" {
			if p.cfg.Name == name {
				return p, nil
			}
			continue
		}
		if (adapter == "" || p.cfg.Adapter == adapter) && p.Serves(target) {
			return p, nil
		}
	}
	if name != "" {
		return nil, fmt.Errorf("no provider named %q on this node", name)
	}
	return nil, fmt.Errorf("no provider on this node serves target %q", target)
}
