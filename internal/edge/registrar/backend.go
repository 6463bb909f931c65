package registrar

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Backend is where the enrollment is kept: the bbolt Store of a single Edge
// (store.go), or the cluster's PostgreSQL (PGStore, pgstore.go). Every
// method that changes something decides and writes in one transaction, so
// that what Service promises (a token joins once, a removal revokes every
// certificate, a renewal never outlives a removal) holds whichever Edge of
// a cluster is asked.
//
// Writes record who made them: the actor is in ctx (withActor), and a
// backend that keeps an audit log writes its entry in the same
// transaction.
type Backend interface {
	// AddToken records a new pending token, refusing a removed Node's
	// (ErrNodeRemoved).
	AddToken(ctx context.Context, t TokenRecord) error
	// Redeem checks token id (check), issues its Node's certificate
	// (issue), records it and uses the token: all or nothing.
	Redeem(ctx context.Context, id string, check func(TokenRecord, bool) error, issue func(nodeID string) (CertRecord, error), now time.Time) (CertRecord, error)
	// Renew decides (check), issues (issue) and records a renewal of
	// nodeID: all or nothing.
	Renew(ctx context.Context, nodeID string, check func(NodeRecord) error, issue func() (CertRecord, error), now time.Time) (CertRecord, error)
	// Standing is what the backend says of nodeID's certificate serial.
	Standing(ctx context.Context, nodeID, serial string) (Standing, error)
	// Seen records an admitted connection of nodeID.
	Seen(ctx context.Context, nodeID, serial string, now time.Time) error
	// Remove removes nodeID: its certificates revoked, its pending
	// tokens deleted.
	Remove(ctx context.Context, nodeID string, now time.Time, mark bool) (known bool, revoked []string, err error)
	// Restore lifts nodeID's removal and returns when it was made.
	Restore(ctx context.Context, nodeID string, now time.Time) (time.Time, error)
	// Contents reads everything, for `edged node list`.
	Contents(ctx context.Context) (Contents, error)
	// Prune deletes what ended as of now (prune.go).
	Prune(ctx context.Context, now time.Time) (int, error)
	// Audit records an action that is not the backend's own (a
	// configuration reload); a backend without an audit log ignores it.
	Audit(ctx context.Context, e AuditEntry) error
	// AuditLog reads the audit log, newest first: at most limit entries
	// older than entry before (0: from the newest). ErrNoAuditLog from a
	// backend without one.
	AuditLog(ctx context.Context, before int64, limit int) ([]AuditEntry, error)
}

var (
	_ Backend = (*Store)(nil)
	_ Backend = (*PGStore)(nil)
)

// ErrDatabaseUnreachable is why a cluster Edge refuses joins, renewals,
// new tokens, removals and restores while the cluster's database does not
// answer. Connection checks go on from what the Edge last knew (fail
// static, PGStore.Standing).
var ErrDatabaseUnreachable = errors.New("cluster database unreachable")

// unreachableRetry is when a Node whose renewal was refused for an
// unreachable database asks again.
const unreachableRetry = 30 * time.Second

// unreachableError is ErrDatabaseUnreachable with its cause. It carries a
// retry time, so a Node's renewal is tried again later (nodeserver reads
// RetryTime), not taken for a verdict on the Node.
type unreachableError struct {
	err     error
	retryAt time.Time
}

func unreachable(err error) error {
	return &unreachableError{err: err, retryAt: time.Now().Add(unreachableRetry)}
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("%v: %v; joins and removals need it (so do new tokens, restores and renewals): try again once it is back", ErrDatabaseUnreachable, e.err)
}

func (e *unreachableError) Is(target error) bool { return target == ErrDatabaseUnreachable }
func (e *unreachableError) Unwrap() error        { return e.err }

// RetryTime is when to try again.
func (e *unreachableError) RetryTime() time.Time { return e.retryAt }

// Actors of the audit log's entries that Service makes itself.
const (
	// ActorAdminSocket is an `edged node` command through the Edge's
	// admin socket (or on the store of a stopped Edge).
	ActorAdminSocket = "edged node (admin socket)"
)

type actorKey struct{}

// withActor returns ctx carrying actor, for the audit log.
func withActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// actorOf is the actor ctx carries, ActorAdminSocket by default.
func actorOf(ctx context.Context) string {
	if a, ok := ctx.Value(actorKey{}).(string); ok && a != "" {
		return a
	}
	return ActorAdminSocket
}
