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

	// Objects lists every name the migrations give a table, index or
	// sequence (see Object), the tables first in the order the dialect's
	// Tables reports them.
	Objects() []Object
	// Migrations lists every migration in version order.
	Migrations() []sqladapters.Migration
	// LockMigrations returns the statement that serializes concurrent
	// migrators and the one that releases it. Unlock is a zero Query when
	// the lock ends with the transaction.
	LockMigrations() (lock, unlock sqladapters.Query)
	// CreateSchema creates the schema (PostgreSQL) or database (MySQL)
	// the table names are qualified with, when they are; none otherwise.
	CreateSchema() []sqladapters.Query
	// ScriptNote is a line for the head of a migration script
	// (sqladapters.Dialect.MigrationScript): whether its statements may
	// run again.
	ScriptNote() string
	// CreateMigrationsTable creates the table recording applied versions
	// (and, with CreateSchema, the schema holding it).
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
	// MoveDue returns the move of up to limit scheduled rows due at or
	// before now, earliest due first and, for equal due times, by id.
	MoveDue(now time.Time, limit int) DueMove
	// RetryMove tells that err, which ended a move's transaction, was a
	// conflict between concurrent moves that the database resolved by
	// rolling one of them back (a deadlock): the move runs again. False
	// where moves never conflict.
	RetryMove(err error) bool

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
	// HeartbeatSettings records that instance is alive for ttl, as
	// Heartbeat does, and stores settings (a JSON object of strings) in
	// its row.
	HeartbeatSettings(instance string, ttl time.Duration, settings string) sqladapters.Query
	// MemberSettings selects the instance and the settings (NULL when it
	// recorded none) of every live instance other than instance, in
	// instance order.
	MemberSettings(instance string) sqladapters.Query
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

	// What follows are the operations not every database has. A Builder
	// declares each of them, answering false (or nil) where its database
	// lacks it, so that what a database can do is said in its own code,
	// checked by the compiler, and never guessed by the store.

	// HighWaterMark selects one integer that grows with every outbox
	// insert, cheap to read (Features.HighWaterMark); false where the
	// database has none.
	HighWaterMark() (sqladapters.Query, bool)
	// PendingHorizon selects one row of Mark, XMin, XID, RetryMin,
	// HoldMin and the number of ids the id sequence hands a session at
	// once (Features.Horizon); false where the database cannot. Its
	// outbox insert must take the transaction's id before the row's id.
	PendingHorizon() (sqladapters.Query, bool)
	// SelectPendingWithAge is SelectPending with a ninth column: each
	// row's age in microseconds by the database's clock; false where the
	// read cannot tell ages.
	SelectPendingWithAge(q sqladapters.PendingQuery) (sqladapters.Query, bool)
	// PendingReadSetup returns the transaction-local settings a read of a
	// large backlog needs: such a read runs in a read-only transaction
	// after them. None where the read needs none.
	PendingReadSetup() []sqladapters.Query
	// MaxMessageBytes is the largest message the database stores,
	// counting its topic, UUID, payload, metadata and ordering key; 0
	// where it stores messages of every size.
	MaxMessageBytes() int
	// Savepoint returns the statements that set a savepoint, roll back
	// to it and release it; false where the database cannot undo part of
	// a transaction.
	Savepoint() (set, rollback, release sqladapters.Query, ok bool)
	// NotifyProbe notifies the outbox's channel, so that a listener can
	// check that notifications arrive; false where the database has no
	// notifications.
	NotifyProbe() (sqladapters.Query, bool)
	// DeleteInboxRange deletes up to limit inbox rows received at or
	// after from and before before, oldest first, and returns one row:
	// the number deleted and the latest received_at among them (from
	// when none). False where deleted rows leave the received_at index at
	// once, so that DeleteInboxBefore serves as well.
	DeleteInboxRange(from, before time.Time, limit int) (sqladapters.Query, bool)
	// Logical returns the statements of the change-data-capture source,
	// nil where the database cannot stream its changes
	// (Features.LogicalReplication).
	Logical() Logical
	// FingerprintBackfill returns the statements that fingerprint errors
	// recorded before the database stored fingerprints, nil where the
	// database hashes them in SQL in the migration itself.
	FingerprintBackfill() FingerprintBackfill
}

// DueMove is one move of due scheduled rows into the outbox, which the
// store runs in one transaction (a savepoint of the caller's when it is
// given one): Lock, then Claim where it is set, then Move.
type DueMove struct {
	// Lock, where set, makes the move wait for any other move of the same
	// outbox until that move's transaction ends, and holds the others off
	// until this one's ends. So the rows of a key move in due order however
	// many forwarder instances move at once: one move's rows take their
	// outbox ids, and commit, before the next move takes the rows due
	// after them. It is a zero Query where the move's own statements
	// serialize moves (see the databases' MoveDue).
	Lock sqladapters.Query
	// Claim, where set, selects and locks the ids (one bigint column) of
	// the rows to move, by due time and id: a database whose move needs
	// the ids (no DELETE ... RETURNING feeding an INSERT).
	Claim sqladapters.Query
	// Move returns the statements that move the rows into the outbox by
	// due time and id, so that outbox ids follow that order, and delete
	// them from the scheduled table; the first statement reports the rows
	// moved. Where Claim is set it gets the claimed ids (never empty),
	// otherwise nil. Concurrent moves never move a row twice.
	Move func(ids []int64) []sqladapters.Query
}

// moveAttempts bounds the runs of one move that concurrent moves roll
// back (Builder.RetryMove).
const moveAttempts = 5

// Logical is what Builder.Logical returns where the database streams the
// outbox's changes through logical replication: the statements of the
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
	// prefix of the outbox's logical decoding messages, the name of its
	// id sequence and that of its count of calls (NULL before the
	// migration that creates it).
	EmitCheck() sqladapters.Query
	// EmitRecord writes r, with its messages' ids drawn from sequence and
	// appended, as a transactional logical decoding message of prefix,
	// and, where emits is not "", the call's number drawn from it in a
	// message of prefix and EmitCountSuffix, only where a logical slot of
	// the database is ready to decode it: it selects one row when it
	// wrote r, none when no such slot exists.
	EmitRecord(prefix, sequence, emits string, r sqladapters.EmitRecord) sqladapters.Query
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

// FingerprintBackfill is what Builder.FingerprintBackfill returns where
// the database cannot hash in SQL: Migrate fingerprints the errors of the
// rows that failed before migration FingerprintVersion, right after
// applying it.
type FingerprintBackfill interface {
	FingerprintVersion() int
	// UnfingerprintedErrors selects id and last error of up to limit
	// rows with an error and no fingerprint and id > afterID, in id
	// order.
	UnfingerprintedErrors(afterID int64, limit int) sqladapters.Query
	// SetFingerprint stores the fingerprint of row id.
	SetFingerprint(id int64, fp sqladapters.ErrorFingerprint) sqladapters.Query
}
