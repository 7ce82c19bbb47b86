package sqlstore

import (
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// Builder builds the SQL of one database for every millbox operation. It
// never executes anything. A Builder also carries the validated table
// names, so one value describes one millbox installation.
type Builder interface {
	// Name is a short name of the database, such as "postgres".
	Name() string
	// Features reports what the database can and cannot do.
	Features() sqladapters.Features
	// OutboxTable is the quoted, qualified name of the outbox table.
	OutboxTable() string
	// InboxTable is the quoted, qualified name of the inbox table.
	InboxTable() string
	// ClassifyError maps a driver error to millbox's errors: a missing
	// table becomes a *sqladapters.MissingTableError, a unique-key
	// violation wraps sqladapters.ErrDuplicate. Other errors are returned
	// unchanged. It is idempotent.
	ClassifyError(err error) error
	// NotifyChannel is the channel the outbox insert notifies on commit,
	// or "" when it does not.
	NotifyChannel() string

	// Migrations lists every migration in version order.
	Migrations() []sqladapters.Migration
	// LockMigrations returns the statement that serializes concurrent
	// migrators and the one that releases it. Unlock is a zero Query when
	// the lock ends with the transaction.
	LockMigrations() (lock, unlock sqladapters.Query)
	// CreateMigrationsTable creates the table recording applied versions
	// (and the schema holding it, where the database has schemas).
	CreateMigrationsTable() []sqladapters.Query
	// AppliedMigrations selects the applied versions (one int column).
	AppliedMigrations() sqladapters.Query
	// RecordMigration records version as applied.
	RecordMigration(version int, name string) sqladapters.Query

	// InsertOutbox inserts msgs (at least one) in as few statements as the
	// database's parameter limit allows, in order: ids grow with the
	// position in msgs.
	InsertOutbox(msgs []sqladapters.OutboxMessage) []sqladapters.Query

	// SelectPending returns columns id, topic, uuid, payload, metadata,
	// key (NULL when empty), attempts, in id order, leaving out
	// q.Exclude. A row whose key has an earlier row waiting for a retry is
	// not returned.
	SelectPending(q sqladapters.PendingQuery) sqladapters.Query
	// CompleteForwarded removes published rows, or marks them published
	// when keep is true.
	CompleteForwarded(ids []int64, keep bool) sqladapters.Query
	// RecordFailure stores a failed attempt.
	RecordFailure(f sqladapters.Failure) sqladapters.Query
	// ListDeadLetters returns columns id, topic, uuid, payload, metadata,
	// key, attempts, last_error, created_at, dead_at of dead rows with
	// id > afterID, in id order.
	ListDeadLetters(afterID int64, limit int) sqladapters.Query
	// CountOutbox selects two int columns: pending rows (including rows
	// waiting for a retry) and dead rows.
	CountOutbox() sqladapters.Query
	// RequeueDeadLetters makes dead rows pending again with zero attempts.
	// ids == nil requeues every dead row.
	RequeueDeadLetters(ids []int64) sqladapters.Query

	// EnsurePartitions creates lease rows 0..n-1 when missing.
	EnsurePartitions(n int) []sqladapters.Query
	// CountPartitions selects the number of lease rows.
	CountPartitions() sqladapters.Query
	// Heartbeat records that instance is alive for ttl.
	Heartbeat(instance string, ttl time.Duration) sqladapters.Query
	// CountMembers selects the number of live instances.
	CountMembers() sqladapters.Query
	// RemoveMember deletes instance and every expired member.
	RemoveMember(instance string) sqladapters.Query
	// ClaimPartitions gives instance up to max partitions that are free or
	// whose lease expired, for ttl.
	ClaimPartitions(instance string, ttl time.Duration, max int) sqladapters.Query
	// RenewPartitions extends the unexpired leases of instance by ttl.
	RenewPartitions(instance string, ttl time.Duration) sqladapters.Query
	// OwnedPartitions selects the partitions instance holds unexpired
	// leases on (one int column), ascending.
	OwnedPartitions(instance string) sqladapters.Query
	// ReleasePartitions frees the given partitions of instance.
	ReleasePartitions(instance string, partitions []int) sqladapters.Query

	// InsertInbox records (consumer, messageID): one row affected the
	// first time, zero (or a unique violation) for a duplicate. Under
	// concurrency it waits for a transaction holding the same key.
	InsertInbox(consumer, messageID string) sqladapters.Query
	// DeleteInboxBefore deletes at most limit rows received before t.
	DeleteInboxBefore(t time.Time, limit int) sqladapters.Query
}

// HighWaterMark is implemented by a Builder that can tell cheaply whether
// rows were added to the outbox: one integer that grows with every insert.
type HighWaterMark interface {
	HighWaterMark() sqladapters.Query
}

// PendingHorizon is implemented by a Builder that can report a Horizon:
// one row of Mark, XMin, XID, RetryMin and the number of ids the id
// sequence hands a session at once. Its outbox insert must take the
// transaction's id before the row's id.
type PendingHorizon interface {
	PendingHorizon() sqladapters.Query
}

// PendingAges is implemented by a Builder whose pending read can return
// each row's age: SelectPending's columns and an eighth, the age in
// microseconds by the database's clock.
type PendingAges interface {
	SelectPendingWithAge(q sqladapters.PendingQuery) sqladapters.Query
}

// PendingReadSetup is implemented by a Builder whose reads of a large
// backlog need transaction-local settings: a backlog read runs in a
// read-only transaction after these statements.
type PendingReadSetup interface {
	PendingReadSetup() []sqladapters.Query
}

// OutboxStats is implemented by a Builder that reads the outbox's size and
// the age of its oldest pending row in one statement: three int columns,
// pending rows, dead rows, and the age in microseconds of the pending row
// with the lowest id (0 when none is pending).
type OutboxStats interface {
	OutboxStats() sqladapters.Query
}

// MessageLimiter is implemented by a Builder whose database cannot store
// messages of every size.
type MessageLimiter interface {
	// MaxMessageBytes is the largest message the database stores,
	// counting its topic, UUID, payload, metadata and ordering key.
	MaxMessageBytes() int
}

// Savepointer is implemented by a Builder whose database can undo part of
// a transaction.
type Savepointer interface {
	// Savepoint returns the statements that set the savepoint, roll back
	// to it and release it.
	Savepoint() (set, rollback, release sqladapters.Query)
}

// NotifyProber is implemented by a Builder that can notify its own
// channel, so that a listener can check that notifications arrive.
type NotifyProber interface {
	NotifyProbe() sqladapters.Query
}

// InboxRangeDeleter is implemented by a Builder whose deleted inbox rows
// stay in the received_at index until vacuum. Its query deletes up to
// limit rows received at or after from and before before, oldest first,
// and returns one row: the number deleted and the latest received_at among
// them (from when none).
type InboxRangeDeleter interface {
	DeleteInboxRange(from, before time.Time, limit int) sqladapters.Query
}
