package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Dimensions a usage report may be grouped by.
const (
	ByPrincipal = "principal"
	ByModel     = "model"
	ByNode      = "node"
	ByEdge      = "edge"
)

// UsageQuery asks for the ledger's totals over [From, To), by minute
// start, grouped by the dimensions By (none: one total).
type UsageQuery struct {
	From, To time.Time
	By       []string
}

// ErrUnreachable is Usage's error while the database is known to be
// unreachable: the report would be this Edge's usage alone.
var ErrUnreachable = errors.New("cluster: usage: the cluster database is unreachable; the ledger's totals are not available until it is back")

// ErrBadDimension is a UsageQuery's By naming what the ledger does not
// group by.
var ErrBadDimension = fmt.Errorf("usage: group by %s, %s, %s or %s", ByPrincipal, ByModel, ByNode, ByEdge)

// Check reports a dimension the ledger does not group by.
func (q UsageQuery) Check() error {
	for _, d := range q.By {
		switch d {
		case ByPrincipal, ByModel, ByNode, ByEdge:
		default:
			return fmt.Errorf("%w, not %q", ErrBadDimension, d)
		}
	}
	return nil
}

// UsageDims are a report row's dimensions: those not grouped by are empty.
type UsageDims struct {
	Principal string `json:"principal,omitempty"`
	Model     string `json:"model,omitempty"`
	Node      string `json:"node,omitempty"`
	Edge      string `json:"edge,omitempty"`
}

// UsageRow is one group's totals.
type UsageRow struct {
	UsageDims
	Counts
}

// UsageReport is the ledger's totals over a window.
type UsageReport struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	By   []string  `json:"by"`
	// Rows are the groups, largest token count first.
	Rows  []UsageRow `json:"rows"`
	Total Counts     `json:"total"`
	// Source says where the figures come from: "ledger" (the cluster's
	// database, with this Edge's usage not yet written added), or
	// "memory" (an Edge alone: its own usage since it started).
	Source string `json:"source"`
}

// dimsOf maps an aggregate's key to the dimensions of q (edge: the
// ledger's Edge).
func dimsOf(q UsageQuery, edge string) func(usageKey) UsageDims {
	by := func(d string) bool { return slices.Contains(q.By, d) }
	p, m, n, e := by(ByPrincipal), by(ByModel), by(ByNode), by(ByEdge)
	return func(k usageKey) UsageDims {
		var d UsageDims
		if p {
			d.Principal = k.principal
		}
		if m {
			d.Model = k.model
		}
		if n {
			d.Node = k.node
		}
		if e {
			d.Edge = edge
		}
		return d
	}
}

// report turns grouped totals into a report.
func report(q UsageQuery, groups map[UsageDims]Counts, source string) UsageReport {
	r := UsageReport{From: q.From.UTC(), To: q.To.UTC(), By: slices.Clone(q.By), Rows: make([]UsageRow, 0, len(groups)), Source: source}
	if r.By == nil {
		r.By = []string{}
	}
	for d, c := range groups {
		r.Rows = append(r.Rows, UsageRow{UsageDims: d, Counts: c})
		r.Total.add(c)
	}
	slices.SortFunc(r.Rows, func(a, b UsageRow) int {
		return cmp.Or(cmp.Compare(b.PromptTokens+b.CompletionTokens, a.PromptTokens+a.CompletionTokens),
			cmp.Compare(b.Requests, a.Requests),
			strings.Compare(a.Principal, b.Principal), strings.Compare(a.Model, b.Model),
			strings.Compare(a.Node, b.Node), strings.Compare(a.Edge, b.Edge))
	})
	return r
}

// usageColumns are the ledger's columns of each dimension.
var usageColumns = map[string]string{ByPrincipal: "principal", ByModel: "model", ByNode: "node_id", ByEdge: "edge_id"}

// Usage returns the ledger's totals for q: what every Edge wrote, and
// what this Edge holds unwritten. With the database unreachable it fails:
// the figures would be this Edge's alone.
func (c *Cluster) Usage(ctx context.Context, q UsageQuery) (UsageReport, error) {
	if err := q.Check(); err != nil {
		return UsageReport{}, err
	}
	c.mu.Lock()
	reachable := c.reachable
	c.mu.Unlock()
	if !reachable {
		return UsageReport{}, ErrUnreachable
	}
	cols := make([]string, 4)
	var group []string
	for i, d := range []string{ByPrincipal, ByModel, ByNode, ByEdge} {
		cols[i] = "''"
		if slices.Contains(q.By, d) {
			cols[i] = usageColumns[d]
			group = append(group, usageColumns[d])
		}
	}
	sql := `SELECT ` + strings.Join(cols, ", ") + `, sum(requests)::int8, sum(prompt_tokens)::int8, sum(completion_tokens)::int8
		FROM iop_usage WHERE minute >= $1 AND minute < $2`
	if len(group) > 0 {
		sql += ` GROUP BY ` + strings.Join(group, ", ")
	} else {
		sql += ` HAVING count(*) > 0`
	}
	rows, err := c.pool.Query(ctx, sql, q.From, q.To)
	var read []UsageRow
	if err == nil {
		read, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (UsageRow, error) {
			var r UsageRow
			err := row.Scan(&r.Principal, &r.Model, &r.Node, &r.Edge, &r.Requests, &r.PromptTokens, &r.CompletionTokens)
			return r, err
		})
	}
	c.setReachable(err)
	if err != nil {
		return UsageReport{}, fmt.Errorf("cluster: usage: %w", err)
	}
	groups := make(map[UsageDims]Counts, len(read))
	for _, r := range read {
		cur := groups[r.UsageDims]
		cur.add(r.Counts)
		groups[r.UsageDims] = cur
	}
	c.ledger.local(q.From, q.To, dimsOf(q, c.self.ID), groups)
	return report(q, groups, "ledger"), nil
}
