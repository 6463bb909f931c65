package edgeconfig

// WarmFirst is scheduling.warm_first, or its default (true): requests are
// routed warm first (issue 23).
func (c *Config) WarmFirst() bool {
	return c.Scheduling.WarmFirst == nil || *c.Scheduling.WarmFirst
}
