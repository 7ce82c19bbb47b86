package sqladapters

import (
	"context"
	"database/sql"
	"time"
)

// Dialect is millbox's store contract for one database: every operation
// the outbox publisher, the forwarder, the inbox and the operations tools
// run on the database.
//
// The outbox table holds only the rows that still have to go: pending rows
// and rows waiting for a retry. Dead letters and the forwarded rows kept
// for audit (forwarder.Config.KeepForwarded) live in tables of their own,
// named after the outbox with the suffixes _dead and _kept, and move
// between the tables in one transaction. So the insert in the application's
// transaction maintains one index, the outbox's primary key, and the
// forwarder reads pending rows through it without walking dead or kept
// rows. Messages published with a due time wait in a table of their own,
// named after the outbox with the suffix _scheduled, until MoveDue moves
// them into the outbox, so scheduled rows never slow the pending read. Each method executes its own SQL on the Executor or
// DB it is given, scans the rows, and maps the driver's errors to millbox's
// (a missing table is a *MissingTableError that says how to migrate, a
// unique-key violation wraps ErrDuplicate), so its callers never build SQL
// or inspect driver errors.
//
// A Dialect value also carries the validated table names, so one value
// describes one millbox installation (outbox, leases, inbox). Choosing a
// database is one constructor: postgres.New, mysql.New or sqlite.New.
//
// Dialect is implemented by millbox's own database packages
// (sqladapters/postgres, sqladapters/mysql, sqladapters/sqlite) and may
// gain methods in any release: use it, do not implement it.
type Dialect interface {
	// Name is a short name of the database, such as "postgres".
	Name() string
	// Features reports what the database can and cannot do.
	Features() Features
	// OutboxTable is the quoted, qualified name of the outbox table.
	OutboxTable() string
	// InboxTable is the quoted, qualified name of the inbox table.
	InboxTable() string
	// NotifyChannel is the channel the outbox insert notifies on commit,
	// or "" when it does not (see postgres.Options.Notify).
	NotifyChannel() string
	// ClassifyError maps a driver error from a statement on this
	// database to millbox's errors, for code that runs SQL of its own
	// next to millbox's (such as the change-data-capture reader). It is
	// idempotent and returns nil for nil.
	ClassifyError(err error) error

	// Migrations lists the schema's migrations in version order.
	Migrations() []Migration
	// AppliedMigrations returns the versions Migrate recorded as applied,
	// ascending; a *MissingTableError when it never ran.
	AppliedMigrations(ctx context.Context, e Executor) ([]int, error)
	// MigrationScript renders the schema as one SQL script, for migration
	// tools (goose, atlas, flyway) and for review: a comment naming the
	// database and tables and saying whether the statements may run
	// again, the statement that creates the schema (PostgreSQL) or
	// database (MySQL) the tables are qualified with, when they are, and
	// then each version's statements as MigrationSQL returns them. It
	// leaves out Migrate's own bookkeeping (lock and version table), so a
	// tool that runs it records the versions itself.
	MigrationScript() string
	// Migrate applies in tx those of migrations (in version order) that
	// are not applied yet, and records them, under a lock that serializes
	// concurrent migrators. Use the Migrate and MigrateTx functions, which
	// pass Migrations().
	Migrate(ctx context.Context, tx Tx, migrations []Migration) error

	// MaxMessageBytes is the largest message the database stores,
	// counting its topic, UUID, payload, metadata (as JSON) and ordering
	// key; 0 when only MaxPayloadBytes limits it.
	MaxMessageBytes() int
	// InsertOutbox writes msgs in tx, in order: ids grow with the
	// position in msgs. Messages with a DueAt go into the scheduled table
	// instead, in order too. When it fails, nothing of msgs stays in tx (a
	// call of several statements runs under a savepoint); on Postgres
	// the transaction is aborted as after any failed statement when the
	// call took one statement.
	InsertOutbox(ctx context.Context, tx Executor, msgs []OutboxMessage) error
	// MoveDue moves up to limit scheduled messages (OutboxMessage.DueAt)
	// whose due time is at or before now from the scheduled table into the
	// outbox, earliest due first and, for equal due times, in the order
	// they were written, in one transaction (its own when e is a DB, a
	// savepoint of e's otherwise). The moved rows are ordinary outbox
	// inserts with new ids: they go after every row already in the outbox.
	// Concurrent callers never move the same row twice, and take turns: a
	// call waits for a concurrent call's transaction to end and then moves
	// the rows due after that one's, so the rows of a key reach the outbox
	// in due order however many forwarder instances move. It reports how many
	// it moved and the due time of the earliest message still scheduled
	// (zero when none is).
	MoveDue(ctx context.Context, e Executor, now time.Time, limit int) (moved int64, next time.Time, err error)

	// ReadPending returns up to q.Limit rows the forwarder may publish
	// next, in id order, leaving out q.Exclude. A row whose key has an
	// earlier row waiting for a retry is not returned: that keeps per-key
	// order while a key backs off. backlog tells that the previous read
	// was full, which on some databases runs the read with settings for
	// large tables (in a read-only transaction when e is a DB).
	ReadPending(ctx context.Context, e Executor, q PendingQuery, backlog bool) ([]OutboxRow, error)
	// CompleteForwarded removes published rows from the outbox, or moves
	// them to the table of forwarded rows kept for audit when keep is
	// true, and reports how many it changed.
	CompleteForwarded(ctx context.Context, e Executor, ids []int64, keep bool) (int64, error)
	// RecordFailure stores a failed attempt and reports the rows changed
	// (0 when the row is gone). A failure with Dead moves the row from the
	// outbox to the dead letters' table, in one transaction (under a
	// savepoint when e is a transaction).
	RecordFailure(ctx context.Context, e Executor, f Failure) (int64, error)
	// HighWaterMark returns a number that grows when a row is inserted
	// (the position of the outbox's id sequence). It fails with
	// errors.ErrUnsupported where Features().HighWaterMark is false.
	HighWaterMark(ctx context.Context, e Executor) (int64, error)
	// PendingHorizon returns what a forwarder needs to know which ids no
	// pending row can take any more (see Horizon). It fails with
	// errors.ErrUnsupported where Features().Horizon is false, and where
	// ids are not drawn in order (a sequence with CACHE above 1).
	PendingHorizon(ctx context.Context, e Executor) (Horizon, error)
	// Logical returns the statements of the change-data-capture source
	// (forwarder/cdc), or nil where the database cannot stream its changes
	// (Features().LogicalReplication is false).
	Logical() Logical
	// NotifyProbe notifies the outbox's channel, so that a listener can
	// check that notifications arrive. It fails with
	// errors.ErrUnsupported when NotifyChannel is "".
	NotifyProbe(ctx context.Context, e Executor) error
	// OutboxStats counts the pending rows, the dead letters, the keys they
	// hold and the scheduled messages, measures how long the oldest
	// pending row has waited and finds the earliest due time, in one cheap
	// statement.
	OutboxStats(ctx context.Context, e Executor) (OutboxStats, error)
	// RequeueDeadLetters moves the given dead letters back into the
	// outbox, under their ids, pending with zero attempts and due now, and
	// reports how many it moved. Their last error stays until they are
	// published; the outbox records when they were requeued. A dead letter
	// that held its key is then read before the key's later rows, whose
	// ids are higher.
	RequeueDeadLetters(ctx context.Context, e Executor, ids []int64) (int64, error)

	// EnsurePartitions creates the lease rows 0..n-1 that are missing.
	EnsurePartitions(ctx context.Context, e Executor, n int) error
	// CountPartitions returns the number of lease rows.
	CountPartitions(ctx context.Context, e Executor) (int, error)
	// Heartbeat records that instance is alive for ttl.
	Heartbeat(ctx context.Context, e Executor, instance string, ttl time.Duration) error
	// HeartbeatSettings does what Heartbeat does and records with it
	// settings: those every forwarder instance of the outbox must agree
	// on. It then compares them with what the other live instances
	// recorded and returns a *SettingMismatchError naming the first of
	// settings, in their order, that one of them recorded with another
	// value. A setting another instance did not record is not compared,
	// so an instance of a version that records fewer settings, or none
	// (Heartbeat), runs next to this one. The row is written even when
	// the settings disagree, so that the other instance learns it too:
	// an instance that refuses to run removes it (RemoveMember). Heartbeat
	// keeps the settings recorded last.
	HeartbeatSettings(ctx context.Context, e Executor, instance string, ttl time.Duration, settings []Setting) error
	// CountMembers returns the number of live instances.
	CountMembers(ctx context.Context, e Executor) (int, error)
	// RemoveMember deletes instance and every expired member.
	RemoveMember(ctx context.Context, e Executor, instance string) error
	// ClaimPartitions gives instance up to max partitions that are free or
	// whose lease expired, for ttl.
	ClaimPartitions(ctx context.Context, e Executor, instance string, ttl time.Duration, max int) error
	// RenewPartitions extends the unexpired leases of instance by ttl.
	RenewPartitions(ctx context.Context, e Executor, instance string, ttl time.Duration) error
	// OwnedPartitions returns the partitions instance holds unexpired
	// leases on, ascending.
	OwnedPartitions(ctx context.Context, e Executor, instance string) ([]int, error)
	// ReleasePartitions frees the given partitions of instance.
	ReleasePartitions(ctx context.Context, e Executor, instance string, partitions []int) error

	// CurrentSchema returns the schema (PostgreSQL) or database (MySQL)
	// holding the tables: the configured one, or else the connection's
	// current one, "" when it has none; "main" on SQLite. Tools name it in
	// what they report.
	CurrentSchema(ctx context.Context, e Executor) (string, error)
	// TopicStats counts the rows of every topic, in topic order: pending,
	// retrying, dead and kept rows and the oldest pending age.
	TopicStats(ctx context.Context, e Executor) ([]TopicStats, error)
	// InboxStats counts the inbox records of every consumer, in consumer
	// order, with the age of the oldest.
	InboxStats(ctx context.Context, e Executor) ([]ConsumerStats, error)
	// PartitionLeases lists the partition leases in partition order, with
	// their live owners.
	PartitionLeases(ctx context.Context, e Executor) ([]PartitionLease, error)
	// ListDeadLetters returns a page of the dead letters q selects, in id
	// order, without payloads and metadata unless q.Payloads.
	ListDeadLetters(ctx context.Context, e Executor, q DeadLetterQuery) ([]DeadLetter, error)
	// DeadLetterIDs returns up to limit ids of the dead letters f selects
	// with id > afterID, in id order.
	DeadLetterIDs(ctx context.Context, e Executor, f DeadLetterFilter, afterID int64, limit int) ([]int64, error)
	// CountDeadLetters counts the dead letters f selects.
	CountDeadLetters(ctx context.Context, e Executor, f DeadLetterFilter) (int64, error)
	// GroupDeadLetters groups the dead letters f selects by last error,
	// most rows first, at most limit groups.
	GroupDeadLetters(ctx context.Context, e Executor, f DeadLetterFilter, limit int) ([]ErrorGroup, error)
	// HeldKeys lists up to limit keys held by a dead letter (see
	// Failure.Hold), in the order of their dead letters' ids, with the
	// messages waiting behind each. It reads the outbox once.
	HeldKeys(ctx context.Context, e Executor, limit int) ([]HeldKey, error)
	// CountHeldKeys counts the keys held by dead letters, reading only
	// the dead letters that hold their keys.
	CountHeldKeys(ctx context.Context, e Executor) (int64, error)
	// DiscardDeadLetters deletes the given dead letters and reports how
	// many; a row requeued meanwhile stays.
	DiscardDeadLetters(ctx context.Context, e Executor, ids []int64) (int64, error)
	// CountForwardedBefore counts the forwarded rows kept for audit that
	// were published before t.
	CountForwardedBefore(ctx context.Context, e Executor, t time.Time) (int64, error)
	// ForwardedIDsBefore returns up to limit ids of forwarded rows
	// published before t with id > afterID, in id order; delete them with
	// DeleteForwarded.
	ForwardedIDsBefore(ctx context.Context, e Executor, t time.Time, afterID int64, limit int) ([]int64, error)
	// DeleteForwarded deletes the given forwarded rows kept for audit and
	// reports how many.
	DeleteForwarded(ctx context.Context, e Executor, ids []int64) (int64, error)
	// CountInboxBefore counts the inbox records received before t; delete
	// them with DeleteInbox.
	CountInboxBefore(ctx context.Context, e Executor, t time.Time) (int64, error)

	// RecordInbox records in tx that consumer processed messageID: true
	// the first time, false for a duplicate. Under concurrency it waits
	// for a transaction holding the same key and reports a duplicate if
	// that one committed.
	RecordInbox(ctx context.Context, tx Executor, consumer, messageID string) (first bool, err error)
	// BeginRecordInbox begins a transaction on db and records the message
	// in it, in one round trip where db implements BeginExecer. It
	// returns the open transaction and true the first time; for a
	// duplicate, or on error, no transaction is left open.
	BeginRecordInbox(ctx context.Context, db DB, opts sql.TxOptions, consumer, messageID string) (Tx, bool, error)
	// DeleteInbox deletes up to limit inbox records received before
	// before, oldest first, and returns how many and where the next batch
	// may start: a batch that starts where the last one ended does not
	// walk the index entries of the rows deleted before it. Pass the zero
	// time as from the first time.
	DeleteInbox(ctx context.Context, e Executor, from, before time.Time, limit int) (n int64, next time.Time, err error)
}

// BeginExecer is implemented by a DB that can begin a transaction and run
// a first statement in it in one round trip, such as pgxv5.DB. BeginExec
// returns the open transaction and the rows the statement affected; when
// either statement fails it leaves no transaction open.
type BeginExecer interface {
	BeginExec(ctx context.Context, opts sql.TxOptions, query string, args ...any) (tx Tx, rowsAffected int64, err error)
}

// Features records the honest differences between databases.
type Features struct {
	// TransactionalDDL is true when schema changes roll back with the
	// transaction (Postgres, SQLite). On MySQL DDL commits implicitly, so
	// migrations never run inside a caller's transaction there.
	TransactionalDDL bool
	// Notify is true when the outbox insert wakes forwarders in other
	// processes on commit (Postgres LISTEN/NOTIFY).
	Notify bool
	// SkipLocked is true when the database supports FOR UPDATE SKIP LOCKED.
	SkipLocked bool
	// ConcurrentWriters is false when the database serializes all write
	// transactions (SQLite).
	ConcurrentWriters bool
	// ExcludeInSQL is true when the pending read leaves out
	// PendingQuery.Exclude in SQL. All three databases do: Postgres
	// hashes the list once per read (NOT IN over a subquery), MySQL and
	// SQLite get it inline. Where it is false, ReadPending reads that many
	// more rows and drops those in flight itself.
	ExcludeInSQL bool
	// HighWaterMark is true when Dialect.HighWaterMark is supported: a
	// forwarder without notifications then watches it every
	// forwarder.Polling.WatchInterval and reads the outbox only when it moved.
	HighWaterMark bool
	// LogicalReplication is true when the outbox can be read through
	// logical replication (PostgreSQL): Dialect.Logical is not nil.
	LogicalReplication bool
	// Horizon is true when Dialect.PendingHorizon is supported and the
	// outbox insert takes its transaction id before the row's id (see
	// Horizon). A forwarder then reads past the ids below the first
	// pending row (PendingQuery.After) instead of walking, with every
	// read, the index entries of the rows it deleted until vacuum
	// removes them.
	Horizon bool
}

// Horizon is one look at the outbox and the database's transactions,
// taken in one statement that runs in a transaction of its own. Where
// Features().Horizon is true, the outbox insert gives its transaction an
// id before it draws the row's id. So every row with an id up to one
// look's Mark belongs to a transaction that took its id before the next
// look's XID; once a later look's XMin has reached that XID, all those
// transactions have ended and no row up to Mark can become visible any
// more. A forwarder reads past such ids when no pending row is left
// among them.
type Horizon struct {
	// Mark is the position of the outbox's id sequence.
	Mark int64
	// XMin is the oldest transaction id still running when the statement
	// started (or the next to be completed when none was).
	XMin uint64
	// XID is the transaction id the statement itself took: every
	// transaction that took one before has a smaller id.
	XID uint64
	// RetryMin is the lowest id of a row waiting for a retry (0: none).
	// Such a row and the later rows of its key become due without being
	// inserted again.
	RetryMin int64
	// HoldMin is the lowest id of a dead letter that holds its key (0:
	// none; see Failure.Hold). The later rows of its key become due
	// without being inserted again when it is requeued or discarded.
	HoldMin int64
}

// Migration is one versioned step of the millbox schema.
type Migration struct {
	Version    int
	Name       string
	Statements []string
}

// OutboxMessage is one message as the outbox publisher stores it.
type OutboxMessage struct {
	Topic    string
	UUID     string
	Payload  []byte
	Metadata []byte // a JSON object of string values
	// Key is the ordering key; empty means the message is not ordered
	// relative to any other.
	Key string
	// KeyHash places the row in a forwarder partition: KeyHash modulo the
	// number of partitions. Always non-negative.
	KeyHash int32
	// DueAt, when not zero, is the time before which the message must not
	// be forwarded: InsertOutbox writes it into the scheduled table, from
	// which MoveDue moves it into the outbox once due. Zero means now.
	DueAt time.Time
}

// OutboxRow is an outbox row as read by the forwarder.
type OutboxRow struct {
	ID       int64
	Topic    string
	UUID     string
	Payload  []byte
	Metadata []byte
	Key      string
	Attempts int
	// KeyHash is the row's key_hash (see OutboxMessage.KeyHash): its
	// forwarder partition is KeyHash modulo the number of partitions.
	// Only ReadPending fills it in.
	KeyHash int32
	// Age is how old the row was when it was read (by the database's
	// clock), where the database reports it; else zero.
	Age time.Duration
}

// PendingQuery selects the outbox rows a forwarder may publish next.
type PendingQuery struct {
	// Partitions is the total number of partitions; Owned lists the ones
	// to read. Owned == nil reads every partition.
	Partitions int
	Owned      []int
	// Exclude lists ids not to return: rows the forwarder has in flight.
	Exclude []int64
	// After, when positive, leaves out rows with an id up to After.
	After int64
	// SkipKeys lists ordering keys whose rows are left out: keys the
	// forwarder holds back itself (a call that hangs), so that their
	// backlog does not fill the read.
	SkipKeys []string
	// DeadLetterHolds leaves out the rows whose key has a dead letter
	// with a lower id that holds it (Failure.Hold), looked up through an
	// index of the dead letters that hold their keys
	// (forwarder.Config.DeadLetterHoldsKey).
	DeadLetterHolds bool
	Limit           int
}

// Failure records one failed publish of a row.
type Failure struct {
	ID int64
	// Attempts is the new attempt count.
	Attempts int
	Error    string
	// Backoff delays the next attempt.
	Backoff time.Duration
	// Dead moves the row to the dead letters.
	Dead bool
	// Hold, with Dead, makes the dead letter hold its key: reads with
	// PendingQuery.DeadLetterHolds leave out the key's later rows until it
	// is requeued or discarded. A row without a key holds nothing.
	Hold bool
}

// Setting is a forwarder setting that every instance of one outbox must
// agree on, as Dialect.HeartbeatSettings records and compares it.
type Setting struct {
	// Name names the setting, such as "DeadLetterHoldsKey"; the error of
	// a disagreement shows it.
	Name string
	// Value is the setting's value as text, compared byte for byte.
	Value string
}

// DeadLetter is a row that exhausted its attempts. Its Payload and
// Metadata are nil when it was listed without them (see DeadLetterQuery).
type DeadLetter struct {
	OutboxRow
	LastError string
	// Fingerprint is LastError's (see ErrorGroup), zero when the row was
	// recorded without one.
	Fingerprint ErrorFingerprint
	CreatedAt   time.Time
	DeadAt      time.Time
	// Holds tells that the dead letter holds its key (Failure.Hold): a
	// forwarder with forwarder.Config.DeadLetterHoldsKey publishes none of
	// the key's later rows until it is requeued or discarded.
	Holds bool
}
