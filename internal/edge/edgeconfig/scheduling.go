package edgeconfig

import (
	"time"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// Scheduling is the `scheduling` section: how the Edge places work beyond a profile's timers.
type Scheduling struct {
	// WakeTimeout is how long a request for a model that only a sleeping Node served waits
	// while a Node on its LAN wakes it (wake on demand, issue 23; see internal/edge/wake): the
	// time a machine takes to resume and its Node to register. Default 2m; 0 turns waking off
	// (such a request is answered at once, as when no Node can wake it); at most 30m.
	WakeTimeout *yamlconf.Duration `yaml:"wake_timeout,omitempty"`
	// WarmFirst routes each request to a Node whose server holds its model loaded, then to one
	// with room to load it, within bounded load (issue 23; internal/edge/sched/warm.go). Default
	// true; false picks by free capacity alone (for comparison: the warm-first benchmark).
	WarmFirst *bool `yaml:"warm_first,omitempty"`
}

// Wake timeout bounds (scheduling.wake_timeout).
const (
	// DefaultWakeTimeout covers a machine resuming from suspend (seconds) and most booting
	// from power-off with wake-on-LAN (a minute or two).
	DefaultWakeTimeout = 2 * time.Minute
	MaxWakeTimeout     = 30 * time.Minute
)

// WakeTimeout is scheduling.wake_timeout, or its default; 0: waking is off.
func (c *Config) WakeTimeout() time.Duration {
	if c.Scheduling.WakeTimeout == nil {
		return DefaultWakeTimeout
	}
	return time.Duration(*c.Scheduling.WakeTimeout)
}

func (c *Config) validateScheduling() yamlconf.Errors {
	var es yamlconf.Errors
	if w := c.Scheduling.WakeTimeout; w != nil && (*w < 0 || time.Duration(*w) > MaxWakeTimeout) {
		es.Add("scheduling.wake_timeout", "must be from 0 (waking off) to %v, got %v", MaxWakeTimeout, time.Duration(*w))
	}
	return es
}
