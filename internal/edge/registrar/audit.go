package registrar

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// The audit log records the cluster's admin actions: who did what to
// which Node, on which Edge, when (issue 22). In a cluster it is the
// iop_audit table, and an enrollment action's entry is written in the
// action's own transaction: there is no action without its entry, nor an
// entry for an action that did not happen. Others (a configuration
// reload) add theirs with Service.Audit.
//
// A single Edge (the bbolt store) keeps no audit log: its admin actions
// are in its log (each is logged at Info), and Service.AuditLog says
// ErrNoAuditLog. One process's log is its whole history; a cluster's is
// spread over its Edges, which is why the cluster gets a table.

// Actions of the entries the enrollment writes.
const (
	ActionTokenIssued  = "token.issued"
	ActionNodeJoined   = "node.joined"
	ActionNodeRenewed  = "node.renewed"
	ActionNodeRemoved  = "node.removed"
	ActionNodeRestored = "node.restored"
)

// AuditEntry is one entry of the audit log.
type AuditEntry struct {
	// ID orders the entries (newer is larger); AuditLog pages by it.
	ID     int64     `json:"id"`
	At     time.Time `json:"at"`
	EdgeID string    `json:"edge_id"`
	// Actor is who did it: "edged node (admin socket)", "node gpu-1",
	// an admin API principal.
	Actor   string `json:"actor"`
	Action  string `json:"action"`
	Subject string `json:"subject"`
	// Detail is the action's facts (serials, a token id), a JSON object.
	Detail json.RawMessage `json:"detail,omitempty"`
}

// ErrNoAuditLog is AuditLog of a backend that keeps none (a single Edge's
// bbolt store).
var ErrNoAuditLog = errors.New("this Edge keeps no audit log (it is not in a cluster): its admin actions are in its log")

// MaxAuditPage bounds one page of AuditLog.
const MaxAuditPage = 1000

// Audit records an admin action that is not the enrollment's own (a
// configuration reload, an admin API call), with detail marshalled as its
// facts. Without an audit log (a single Edge) it does nothing.
func (s *Service) Audit(ctx context.Context, actor, action, subject string, detail any) error {
	raw, err := json.Marshal(detail)
	if err != nil {
		return err
	}
	if detail == nil {
		raw = nil
	}
	return s.store.Audit(ctx, AuditEntry{At: s.opts.Now(), EdgeID: s.opts.EdgeID, Actor: actor, Action: action, Subject: subject, Detail: raw})
}

// AuditLog returns at most limit entries (MaxAuditPage at most), newest
// first, older than the entry with id before (0: from the newest); the
// next page is before the last entry's ID.
func (s *Service) AuditLog(ctx context.Context, before int64, limit int) ([]AuditEntry, error) {
	if limit <= 0 || limit > MaxAuditPage {
		limit = MaxAuditPage
	}
	return s.store.AuditLog(ctx, before, limit)
}

// Audit does nothing: a single Edge keeps no audit log (see above).
func (s *Store) Audit(context.Context, AuditEntry) error { return nil }

// AuditLog is ErrNoAuditLog.
func (s *Store) AuditLog(context.Context, int64, int) ([]AuditEntry, error) {
	return nil, ErrNoAuditLog
}
