package edgeclient

import (
	"context"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// StaticProviders is a Providers whose set never changes and is ready at
// once.
func StaticProviders(ps []*wirepb.Provider) Providers { return staticProviders(ps) }

type staticProviders []*wirepb.Provider

func (s staticProviders) Snapshot() []*wirepb.Provider        { return s }
func (s staticProviders) WaitReady(ctx context.Context) error { return ctx.Err() }
func (s staticProviders) Changed() <-chan struct{}            { return nil }
