package execution

import (
	"context"
	"slices"
	"time"

	"github.com/iop-dev/iop/quicwire"
)

// TargetHealthUnavailable is the wire Target.health of a target that an
// exact-target probe found unavailable after a stall (R6). The Node keeps
// re-probing it (Supervision.Recovery) and clears the mark when it answers;
// the Edge keeps such a target out of selection meanwhile.
const TargetHealthUnavailable = quicwire.TargetHealthUnavailable

// observe records the evidence of a finalized stall on target (R6), and
// counts it by its classification. Only unavailable evidence changes
// anything: the target is marked and a recovery prober starts. Available
// or unknown evidence grants nothing.
func (p *Provider) observe(target string, ev Evidence) {
	p.metrics.Stalled(ev.Classification)
	if ev.ProviderHealth != HealthUnavailable || target == "" {
		return
	}
	p.mu.Lock()
	if p.unhealthy[target] {
		p.mu.Unlock()
		return
	}
	if p.unhealthy == nil {
		p.unhealthy = make(map[string]bool)
	}
	p.unhealthy[target] = true
	ctx := p.superCtx
	if ctx != nil {
		p.recovering.Add(1)
	}
	p.mu.Unlock()
	p.log.Warn("target unavailable after a response stall; probing it until it answers", "target", target)
	p.notify()
	if ctx != nil {
		go p.recoverTarget(ctx, target)
	}
}

// TargetUnhealthy reports whether target is marked unavailable.
func (p *Provider) TargetUnhealthy(target string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unhealthy[target]
}

// recoverTarget probes target with backoff until it answers available (or
// the provider stops), then clears its mark and reports the change. A
// target the model server no longer lists (inventory.go) is not probed
// further: its mark is dropped, and it is out of the provider's list anyway.
func (p *Provider) recoverTarget(ctx context.Context, target string) {
	defer p.recovering.Done()
	for n := 0; ; n++ {
		t := time.NewTimer(p.sup.Recovery.Delay(n))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		p.mu.Lock()
		gone := !slices.Contains(p.targets, target)
		if gone {
			delete(p.unhealthy, target)
		}
		p.mu.Unlock()
		if gone {
			p.log.Info("target no longer listed; no longer probing it", "target", target)
			return
		}
		pl, err := p.Current()
		if err != nil {
			continue // offline: the supervisor is restarting it
		}
		pctx, cancel := context.WithTimeout(ctx, p.sup.probeTimeout())
		h, err := pl.Probe(pctx, target)
		cancel()
		if ev := EvidenceFrom(h, err); ev.ProviderHealth != HealthAvailable {
			p.log.Debug("target still not available", "target", target, "health", ev.ProviderHealth, "err", err)
			continue
		}
		p.mu.Lock()
		delete(p.unhealthy, target)
		p.mu.Unlock()
		p.log.Info("target answers its probe again", "target", target, "probes", n+1)
		p.notify()
		return
	}
}

func (s Supervision) probeTimeout() time.Duration {
	if s.ProbeTimeout > 0 {
		return s.ProbeTimeout
	}
	return DefaultProbeTimeout
}
