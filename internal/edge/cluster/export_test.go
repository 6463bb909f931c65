package cluster

import "context"

// Kill ends c as kill -9 ends an Edge's process: its connections close
// under it (the session's socket first, as the kernel closes them), and it
// neither writes its ledger nor leaves.
func (c *Cluster) Kill() {
	c.killed = true
	if conn := c.sess.conn.Load(); conn != nil {
		_ = conn.PgConn().Conn().Close()
	}
	c.cancelSession()
	<-c.sessionDone
	if err := c.Stop(context.Background()); err != nil {
		panic(err)
	}
	c.pool.Reset()
}

// WriteLedger writes what the ledger holds now, as its next flush would.
func (l *Ledger) WriteLedger(ctx context.Context) error { return l.write(ctx) }

// NodeWrites is how many times c wrote its Nodes.
func (c *Cluster) NodeWrites() uint64 { return c.nodeWrites.Load() }

// SendBatch sends rows as the batch id, as a write sent again after its
// connection broke does.
func (l *Ledger) SendBatch(ctx context.Context, id int64, principal string, prompt int64) error {
	return l.send(ctx, id, map[usageKey]Counts{{minute: l.now().Unix() / 60, principal: principal}: {Requests: 1, PromptTokens: prompt}})
}
