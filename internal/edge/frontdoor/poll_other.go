//go:build !linux

package frontdoor

// connPoller is Linux's epoll watch of detached connections; elsewhere
// there is none, and no request is detached (net/http serves it whole).
type connPoller struct{}

func newConnPoller() *connPoller { return nil }

func (p *connPoller) add(*Detached) error    { panic("frontdoor: no poller") }
func (p *connPoller) rearm(*Detached) error  { panic("frontdoor: no poller") }
func (p *connPoller) remove(*Detached, bool) {}
