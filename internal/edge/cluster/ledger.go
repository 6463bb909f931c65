package cluster

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of LedgerOptions.
const (
	// DefaultLedgerFlush is how often the ledger writes what it buffered.
	DefaultLedgerFlush = 5 * time.Second
	// DefaultLedgerMax bounds the aggregates (one per minute, principal,
	// model and Node) the ledger holds unwritten: with the database away,
	// about an hour and a half of a busy Edge (a thousand combinations a
	// minute), some tens of MiB.
	DefaultLedgerMax = 100_000
)

// LedgerOptions configure the usage ledger.
type LedgerOptions struct {
	// Flush is how often buffered usage is written; 0 is
	// DefaultLedgerFlush.
	Flush time.Duration
	// MaxBuffered bounds the aggregates held; 0 is DefaultLedgerMax. Past
	// it the oldest minute's aggregates are dropped (and counted). A
	// ledger without a database (Single) keeps this many aggregates in
	// memory, forgetting the oldest minutes.
	MaxBuffered int
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Counts are the usage of some work: how many requests, and the tokens
// their providers reported.
type Counts struct {
	Requests         int64 `json:"requests"`
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

func (c *Counts) add(o Counts) {
	c.Requests += o.Requests
	c.PromptTokens += o.PromptTokens
	c.CompletionTokens += o.CompletionTokens
}

// usageKey is one aggregate's dimensions.
type usageKey struct {
	minute                 int64 // Unix minute
	principal, model, node string
}

// usageBatch is a set of aggregates sent as one statement under one id.
type usageBatch struct {
	id   int64
	rows map[usageKey]Counts
}

// Ledger is the usage ledger (iop_usage): tokens by minute, Edge,
// principal, model and Node. Record adds to an aggregate in memory, the
// hot path's only cost; every Flush the aggregates go to the database as
// one statement that adds them to the rows there. Never a write per
// request, never per token.
//
// With the database unreachable the aggregates stay in memory, new usage
// adding to them, up to MaxBuffered; past it the oldest minute is dropped
// and counted (Dropped). Below the bound nothing recorded is lost, and
// nothing is counted twice: a batch whose write's outcome is unknown (the
// connection broke after it was sent) is sent again under the same id,
// which the database applies once.
type Ledger struct {
	pool  *pgxpool.Pool // nil: in memory only (Single)
	edge  string
	now   func() time.Time
	flush time.Duration
	max   int
	log   *slog.Logger
	// reached is told each write's outcome: the cluster's view of whether
	// the database is reachable. Nil for Single.
	reached func(error)

	mu      sync.Mutex
	current map[usageKey]Counts
	// pending is a batch formed and not known to be written: in flight,
	// or sent when the connection broke.
	pending *usageBatch
	// dropping: drops happened since the last write that succeeded (to
	// log them once).
	dropping bool

	dropped atomic.Uint64
}

func newLedger(pool *pgxpool.Pool, edge string, opts LedgerOptions, log *slog.Logger) *Ledger {
	l := &Ledger{
		pool: pool, edge: edge, now: opts.Now, log: log,
		flush:   cmp.Or(opts.Flush, DefaultLedgerFlush),
		max:     cmp.Or(opts.MaxBuffered, DefaultLedgerMax),
		current: make(map[usageKey]Counts),
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	return l
}

// Record adds one piece of work to the ledger: a request by principal for
// model, run on node, and the tokens its provider reported. Safe from any
// goroutine; a nil *Ledger records nothing.
func (l *Ledger) Record(principal, model, node string, prompt, completion int64) {
	if l == nil {
		return
	}
	k := usageKey{minute: l.now().Unix() / 60, principal: principal, model: model, node: node}
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.current[k]
	if !ok && l.heldLocked() >= l.max && !l.dropOldestLocked(k.minute) {
		// Every aggregate held is of this minute: the new one is the one
		// that does not fit.
		l.countDropLocked(1)
		return
	}
	c.add(Counts{Requests: 1, PromptTokens: prompt, CompletionTokens: completion})
	l.current[k] = c
}

// heldLocked is how many aggregates the ledger holds.
func (l *Ledger) heldLocked() int {
	n := len(l.current)
	if l.pending != nil {
		n += len(l.pending.rows)
	}
	return n
}

// dropOldestLocked drops every aggregate of the oldest minute held, if it
// is older than before; false when there is none.
func (l *Ledger) dropOldestLocked(before int64) bool {
	oldest := before
	for k := range l.current {
		oldest = min(oldest, k.minute)
	}
	if l.pending != nil {
		for k := range l.pending.rows {
			oldest = min(oldest, k.minute)
		}
	}
	if oldest >= before {
		return false
	}
	n := 0
	for _, m := range []map[usageKey]Counts{l.current, l.pendingRowsLocked()} {
		for k := range m {
			if k.minute == oldest {
				delete(m, k)
				n++
			}
		}
	}
	if l.pool != nil {
		l.countDropLocked(n)
	}
	return true
}

func (l *Ledger) pendingRowsLocked() map[usageKey]Counts {
	if l.pending == nil {
		return nil
	}
	return l.pending.rows
}

// countDropLocked counts n aggregates dropped, and logs the first drop
// since the ledger last wrote.
func (l *Ledger) countDropLocked(n int) {
	l.dropped.Add(uint64(n))
	if !l.dropping {
		l.dropping = true
		l.log.Error("cluster: the usage ledger's buffer is full (the database has been unreachable for long): "+
			"dropping the oldest minutes' usage; see iop_edge_cluster_ledger_dropped_total", "max", l.max)
	}
}

// Buffered is how many aggregates wait to be written to the database (0
// for a ledger without one).
func (l *Ledger) Buffered() int {
	if l == nil || l.pool == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heldLocked()
}

// Dropped is how many aggregates were dropped, unwritten, past the bound.
func (l *Ledger) Dropped() uint64 {
	if l == nil {
		return 0
	}
	return l.dropped.Load()
}

// run writes the buffer every Flush until ctx is done.
func (l *Ledger) run(ctx context.Context) {
	t := time.NewTicker(l.flush)
	defer t.Stop()
	var cleaned time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fctx, cancel := context.WithTimeout(ctx, max(l.flush, 5*time.Second))
		if err := l.write(fctx); err == nil && time.Since(cleaned) > time.Hour {
			// Batch ids are needed only as long as a batch may be sent
			// again: a day is plenty.
			_, err = l.pool.Exec(fctx, `DELETE FROM iop_usage_batches WHERE edge_id = $1 AND written_at < now() - interval '1 day'`, l.edge)
			if err == nil {
				cleaned = time.Now()
			}
		}
		cancel()
	}
}

// write writes what the ledger holds: the pending batch if there is one,
// then a batch of everything recorded since. It stops at the first error,
// keeping what it could not write.
func (l *Ledger) write(ctx context.Context) error {
	if l.pool == nil {
		return nil
	}
	for {
		l.mu.Lock()
		b := l.pending
		if b == nil {
			if len(l.current) == 0 {
				l.mu.Unlock()
				return nil
			}
			b = &usageBatch{id: batchID(), rows: l.current}
			l.current = make(map[usageKey]Counts)
			l.pending = b
		}
		// A drop may delete from b.rows while the statement is on its
		// way: send a copy.
		rows := maps.Clone(b.rows)
		l.mu.Unlock()

		err := l.send(ctx, b.id, rows)
		if l.reached != nil {
			l.reached(err)
		}

		l.mu.Lock()
		switch {
		case err == nil:
			l.pending = nil
			if l.dropping {
				l.dropping = false
				l.log.Warn("cluster: the usage ledger writes again; usage dropped meanwhile", "aggregates_dropped_total", l.dropped.Load())
			}
		case notApplied(err):
			// The statement did not run: its usage joins what came
			// since, to go in the next batch.
			l.pending = nil
			for k, c := range b.rows {
				cur := l.current[k]
				cur.add(c)
				l.current[k] = cur
			}
		}
		l.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// notApplied reports whether err says a statement surely did not change
// the database: it was never sent, or the server refused it (one
// statement is one transaction). Any other error may have come after the
// commit.
func notApplied(err error) bool {
	var pgErr *pgconn.PgError
	return pgconn.SafeToRetry(err) || errors.As(err, &pgErr)
}

// usageInsert adds a batch's aggregates to iop_usage, once per batch id:
// the first CTE records the id, and the rows are added only when it was
// new. One statement, so one transaction.
const usageInsert = `
WITH batch AS (
	INSERT INTO iop_usage_batches (edge_id, batch_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1
)
INSERT INTO iop_usage AS u (minute, edge_id, principal, model, node_id, requests, prompt_tokens, completion_tokens)
SELECT a.minute, $1, a.principal, a.model, a.node_id, a.requests, a.prompt_tokens, a.completion_tokens
FROM unnest($3::timestamptz[], $4::text[], $5::text[], $6::text[], $7::int8[], $8::int8[], $9::int8[])
	AS a(minute, principal, model, node_id, requests, prompt_tokens, completion_tokens)
WHERE EXISTS (SELECT 1 FROM batch)
ON CONFLICT (minute, edge_id, principal, model, node_id) DO UPDATE SET
	requests = u.requests + excluded.requests,
	prompt_tokens = u.prompt_tokens + excluded.prompt_tokens,
	completion_tokens = u.completion_tokens + excluded.completion_tokens`

// send writes one batch.
func (l *Ledger) send(ctx context.Context, id int64, rows map[usageKey]Counts) error {
	n := len(rows)
	minutes, principals, models, nodes := make([]time.Time, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	requests, prompts, completions := make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n)
	for k, c := range rows {
		minutes = append(minutes, time.Unix(k.minute*60, 0).UTC())
		principals, models, nodes = append(principals, k.principal), append(models, k.model), append(nodes, k.node)
		requests, prompts, completions = append(requests, c.Requests), append(prompts, c.PromptTokens), append(completions, c.CompletionTokens)
	}
	_, err := l.pool.Exec(ctx, usageInsert, l.edge, id, minutes, principals, models, nodes, requests, prompts, completions)
	return err
}

// batchID is a random id for a batch: unique among an Edge's batches of a
// day without any state kept across restarts.
func batchID() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return int64(binary.BigEndian.Uint64(b[:]) >> 1)
}

// local adds the aggregates the ledger holds in [from, to) to out, by the
// dimensions of key.
func (l *Ledger) local(from, to time.Time, key func(usageKey) UsageDims, out map[UsageDims]Counts) {
	if l == nil {
		return
	}
	lo, hi := from.Unix(), to.Unix()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range []map[usageKey]Counts{l.current, l.pendingRowsLocked()} {
		for k, c := range m {
			if at := k.minute * 60; at >= lo && at < hi {
				r := key(k)
				cur := out[r]
				cur.add(c)
				out[r] = cur
			}
		}
	}
}
