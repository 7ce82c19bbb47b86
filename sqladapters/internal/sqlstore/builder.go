package sqlstore

import (
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// Builder builds the SQL of one database for every millbox operation. It
// never executes anything.
//
// Steps: a method that returns several statements moves rows between
// tables. The store runs them in order in one transaction (under a
// savepoint when it is given a transaction), and reports the rows the
// first one changed. A database that moves rows in one statement returns
// one. A Builder also carries the validated table
// names, so one value describes one millbox installation.
//
// Ages and remaining lease times are computed by the database, in
// microseconds, so the clock of the machine running the operation does not
// matter; so are the ages of a DeadLetterFilter. Times passed in (the
// prune cut-offs) are compared with the stored timestamps (UTC).
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

	// Schema returns the schema (PostgreSQL) or database (MySQL) the
	// table names are qualified with, "" when they are not, and the
	// statement that selects the connection's current one then (one text
	// column; a zero Query where the database has none, SQLite).
	Schema() (name string, current sqladapters.Query)

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
	// InsertScheduled inserts msgs (at least one, each with a DueAt) into
	// the scheduled table, in order: ids grow with the position in msgs.
	InsertScheduled(msgs []sqladapters.OutboxMessage) []sqladapters.Query
	// NextDue selects the due time of the earliest scheduled row in
	// microseconds since the Unix epoch (one bigint column, NULL when
	// none is scheduled).
	NextDue() sqladapters.Query

	// SelectPending returns columns id, topic, uuid, payload, metadata,
	// key (NULL when empty), attempts, in id order, leaving out
	// q.Exclude. A row whose key has an earlier row waiting for a retry is
	// not returned, nor, with q.DeadLetterHolds, one whose key has an earlier
	// dead letter that holds it.
	SelectPending(q sqladapters.PendingQuery) sqladapters.Query
	// CompleteForwarded removes published rows from the outbox, or moves
	// them to the kept table when keep is true (see Steps).
	CompleteForwarded(ids []int64, keep bool) []sqladapters.Query
	// RecordFailure stores a failed attempt, with the fingerprint of the
	// error text it stores (sqladapters.FingerprintError); with f.Dead it
	// moves the row to the dead letters' table instead (see Steps),
	// holding its key with f.Hold when it has one.
	RecordFailure(f sqladapters.Failure) []sqladapters.Query
	// OutboxStats selects six columns: pending rows (including rows
	// waiting for a retry), dead rows, how long the pending row with the
	// lowest id has waited, in microseconds (0 when none is pending), the
	// keys held by dead letters, scheduled rows, and the earliest due time
	// in microseconds since the Unix epoch (NULL when none is scheduled).
	OutboxStats() sqladapters.Query
	// RequeueDeadLetters moves the given dead letters back into the
	// outbox under their ids, with zero attempts, due now, and records when
	// in requeued_at, from which the ages of pending rows count (ids is
	// never empty; see Steps).
	RequeueDeadLetters(ids []int64) []sqladapters.Query

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

	// TopicStats selects, per topic in topic order: topic, pending rows
	// (including rows waiting for a retry), rows waiting for a retry, dead
	// rows, forwarded rows kept, how long the oldest pending row has
	// waited in microseconds (NULL when none is pending), scheduled rows,
	// and their earliest due time in microseconds since the Unix epoch
	// (NULL when none is scheduled).
	TopicStats() sqladapters.Query
	// InboxStats selects, per consumer in consumer order: consumer,
	// records, and the age of the oldest record in microseconds.
	InboxStats() sqladapters.Query
	// PartitionLeases selects, per partition in order: partition, the
	// owner holding an unexpired lease (NULL when free or expired), and
	// the microseconds until that lease expires (NULL when free or
	// expired).
	PartitionLeases() sqladapters.Query
	// SelectDeadLetters selects the page q of dead rows, in id order, with
	// columns id, topic, uuid, key (NULL when empty), attempts, last error
	// ('' when none), error fingerprint (16 bytes, NULL when none),
	// created_at, dead_at, whether it holds its key, and with q.Payloads
	// payload and metadata too.
	// A filter on a fingerprint reads through an index of the dead rows'
	// fingerprints.
	SelectDeadLetters(q sqladapters.DeadLetterQuery) sqladapters.Query
	// SelectHeldKeys selects, per key held by a dead letter, in the order
	// of the lowest id of its holding dead letters, at most limit: the
	// key, that id, and the key's outbox rows with higher ids.
	SelectHeldKeys(limit int) sqladapters.Query
	// CountHeldKeys selects the number of keys held by dead letters.
	CountHeldKeys() sqladapters.Query
	// SelectDeadLetterIDs selects the ids (one bigint column) of the dead
	// rows f selects with id > afterID, in id order, at most limit.
	SelectDeadLetterIDs(f sqladapters.DeadLetterFilter, afterID int64, limit int) sqladapters.Query
	// CountDeadLetters selects the number of dead rows f selects.
	CountDeadLetters(f sqladapters.DeadLetterFilter) sqladapters.Query
	// GroupDeadLetters selects, per error fingerprint of the dead rows f
	// selects, most rows first, at most limit groups: fingerprint (NULL
	// for rows without), the last error of the group's lowest id ('' when
	// none), rows, the lowest id, and the ages in microseconds of the
	// earliest and of the latest death.
	GroupDeadLetters(f sqladapters.DeadLetterFilter, limit int) sqladapters.Query
	// DeleteDeadLetters deletes the given dead letters (ids is never
	// empty); a row requeued in the meantime stays.
	DeleteDeadLetters(ids []int64) sqladapters.Query
	// CountForwardedBefore selects the number of forwarded rows kept that
	// were published before t.
	CountForwardedBefore(t time.Time) sqladapters.Query
	// SelectForwardedIDs selects the ids (one bigint column) of forwarded
	// rows published before t with id > afterID, in id order, at most
	// limit.
	SelectForwardedIDs(t time.Time, afterID int64, limit int) sqladapters.Query
	// DeleteForwarded deletes the given kept rows (ids is never empty).
	DeleteForwarded(ids []int64) sqladapters.Query
	// CountInboxBefore selects the number of inbox records received before
	// t.
	CountInboxBefore(t time.Time) sqladapters.Query

	// InsertInbox records (consumer, messageID): one row affected the
	// first time, zero (or a unique violation) for a duplicate. Under
	// concurrency it waits for a transaction holding the same key.
	InsertInbox(consumer, messageID string) sqladapters.Query
	// DeleteInboxBefore deletes at most limit rows received before t.
	DeleteInboxBefore(t time.Time, limit int) sqladapters.Query
}

// DueMover is implemented by a Builder that moves scheduled rows without
// reading their ids first. Every Builder implements DueMover or
// DueClaimer.
type DueMover interface {
	// MoveDue moves up to limit scheduled rows due at or before now into
	// the outbox, ordered by due time and id, so that outbox ids follow
	// that order (see Steps: the first statement reports the rows moved).
	// Concurrent moves never move a row twice.
	MoveDue(now time.Time, limit int) []sqladapters.Query
}

// DueClaimer is implemented by a Builder whose database moves scheduled
// rows in steps that need their ids (no DELETE ... RETURNING feeding an
// INSERT). The store runs ClaimDue and then MoveClaimed in one
// transaction.
type DueClaimer interface {
	// ClaimDue selects and locks the ids (one bigint column) of up to
	// limit scheduled rows due at or before now, by due time and id,
	// skipping rows another transaction holds where the database can.
	ClaimDue(now time.Time, limit int) sqladapters.Query
	// MoveClaimed inserts the rows with the given ids into the outbox, by
	// due time and id, and deletes them from the scheduled table (ids is
	// never empty).
	MoveClaimed(ids []int64) []sqladapters.Query
	// RetryMove tells that err, which ended a move's transaction, was a
	// conflict between concurrent moves that the database resolved by
	// rolling one of them back (a deadlock): the move runs again.
	RetryMove(err error) bool
}

// moveAttempts bounds the runs of one move that concurrent moves roll
// back (DueClaimer.RetryMove).
const moveAttempts = 5

// HighWaterMark is implemented by a Builder that can tell cheaply whether
// rows were added to the outbox: one integer that grows with every insert.
type HighWaterMark interface {
	HighWaterMark() sqladapters.Query
}

// PendingHorizon is implemented by a Builder that can report a Horizon:
// one row of Mark, XMin, XID, RetryMin, HoldMin and the number of ids the
// id sequence hands a session at once. Its outbox insert must take the
// transaction's id before the row's id.
type PendingHorizon interface {
	PendingHorizon() sqladapters.Query
}

// PendingAges is implemented by a Builder whose pending read can return
// each row's age: SelectPending's columns and a ninth, the age in
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

// Logical is implemented by a Builder whose database streams the outbox's
// changes through logical replication: the statements of the
// change-data-capture source (sqladapters.Logical). Positions (LSNs) are
// selected as decimal numbers, transaction ids as bigint.
type Logical interface {
	// LogicalCheck selects one row: wal_level, the current role, whether
	// it may replicate, the outbox table's oid (0 when missing), whether
	// the publication and slot exist, server_version_num,
	// max_slot_wal_keep_size in megabytes (-1 when unset), whether the
	// slot is a failover slot and the number of physical standbys.
	LogicalCheck(publication, slot string) sqladapters.Query
	// PublicationExists selects whether the publication exists.
	PublicationExists(publication string) sqladapters.Query
	// CreatePublication creates the publication of the outbox's inserts.
	CreatePublication(publication string) sqladapters.Query
	// SlotExists selects whether the slot exists.
	SlotExists(slot string) sqladapters.Query
	// CreateSlot creates the slot, a failover slot with failover; it
	// returns rows.
	CreateSlot(slot string, failover bool) sqladapters.Query
	// DropSlot drops the slot where it exists; it returns rows.
	DropSlot(slot string) sqladapters.Query
	// DropPublication drops the publication where it exists.
	DropPublication(publication string) sqladapters.Query
	// Slot selects the slot's confirmed position, whether it is active,
	// and the bytes of WAL it retains (no row when it does not exist).
	Slot(slot string) sqladapters.Query
	// PendingKeys selects the mark (lsn, xmin) and, per distinct key of
	// the pending rows (with holds, and of the dead letters that hold
	// their keys), whether it is a key and the key ('' without one); one
	// row of NULL keys when there is none.
	PendingKeys(holds bool) sqladapters.Query
	// ReadKeys selects the mark and the pending rows of the keys (a text
	// array parameter) in id order, with whether each is due, the seconds
	// until it is, its age in microseconds and false; with holds, the dead
	// letters that hold those keys among them, with true last; one row of
	// NULL row columns when none matches.
	ReadKeys(keys []string, unkeyed bool, limit int, holds bool) sqladapters.Query
	// EmitCheck selects one row: wal_level, server_version_num, the
	// prefix of the outbox's logical decoding messages and the name of its
	// id sequence.
	EmitCheck() sqladapters.Query
	// EmitRecord writes r, with its messages' ids drawn from sequence and
	// appended, as a transactional logical decoding message of prefix,
	// only where a logical slot of the database is ready to decode it: it
	// selects one row when it wrote r, none when no such slot exists.
	EmitRecord(prefix, sequence string, r sqladapters.EmitRecord) sqladapters.Query
	// WriteMessages returns the statements writing ms into the tables
	// (see sqladapters.Logical.WriteMessages); the last selects the
	// writing transaction's 32-bit id.
	WriteMessages(ms []sqladapters.WrittenMessage) []sqladapters.Query
	// CompleteStreamed removes (or keeps, keep) the rows with the given
	// ids and selects, per row, the oldest running transaction of the
	// statement's snapshot and the id of a row it changed (NULL when
	// none): at least one row.
	CompleteStreamed(ids []int64, keep bool) sqladapters.Query
	// IsDuplicateObject tells an error of creating what a concurrent
	// caller created first.
	IsDuplicateObject(err error) bool
}

// FingerprintBackfill is implemented by a Builder whose database cannot
// hash in SQL: Migrate fingerprints the errors of the rows that failed
// before migration FingerprintVersion, right after applying it.
type FingerprintBackfill interface {
	FingerprintVersion() int
	// UnfingerprintedErrors selects id and last error of up to limit
	// rows with an error and no fingerprint and id > afterID, in id
	// order.
	UnfingerprintedErrors(afterID int64, limit int) sqladapters.Query
	// SetFingerprint stores the fingerprint of row id.
	SetFingerprint(id int64, fp sqladapters.ErrorFingerprint) sqladapters.Query
}
