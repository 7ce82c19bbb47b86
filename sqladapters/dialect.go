package sqladapters

import (
	"context"
	"database/sql"
	"time"
)

// Dialect is millbox's store contract for one database: every operation
// the outbox publisher, the forwarder, the inbox and the operations tools
// run on the database. Each method executes its own SQL on the Executor or
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
	// position in msgs. When it fails, nothing of msgs stays in tx (a
	// call of several statements runs under a savepoint); on Postgres
	// the transaction is aborted as after any failed statement when the
	// call took one statement.
	InsertOutbox(ctx context.Context, tx Executor, msgs []OutboxMessage) error

	// ReadPending returns up to q.Limit rows the forwarder may publish
	// next, in id order, leaving out q.Exclude. A row whose key has an
	// earlier row waiting for a retry is not returned: that keeps per-key
	// order while a key backs off. backlog tells that the previous read
	// was full, which on some databases runs the read with settings for
	// large tables (in a read-only transaction when e is a DB).
	ReadPending(ctx context.Context, e Executor, q PendingQuery, backlog bool) ([]OutboxRow, error)
	// CompleteForwarded removes published rows, or stamps them published
	// when keep is true, and reports how many it changed.
	CompleteForwarded(ctx context.Context, e Executor, ids []int64, keep bool) (int64, error)
	// RecordFailure stores a failed attempt and reports the rows changed
	// (0 when the row is gone).
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
	// NotifyProbe notifies the outbox's channel, so that a listener can
	// check that notifications arrive. It fails with
	// errors.ErrUnsupported when NotifyChannel is "".
	NotifyProbe(ctx context.Context, e Executor) error
	// OutboxStats counts the pending and dead rows and, where the
	// database can tell, the age of the oldest pending row.
	OutboxStats(ctx context.Context, e Executor) (OutboxStats, error)
	// ListDeadLetters returns up to limit dead rows with id > afterID, in
	// id order.
	ListDeadLetters(ctx context.Context, e Executor, afterID int64, limit int) ([]DeadLetter, error)
	// RequeueDeadLetters makes the given dead rows pending again with zero
	// attempts (every dead row when ids is nil) and reports how many.
	RequeueDeadLetters(ctx context.Context, e Executor, ids []int64) (int64, error)

	// EnsurePartitions creates the lease rows 0..n-1 that are missing.
	EnsurePartitions(ctx context.Context, e Executor, n int) error
	// CountPartitions returns the number of lease rows.
	CountPartitions(ctx context.Context, e Executor) (int, error)
	// Heartbeat records that instance is alive for ttl.
	Heartbeat(ctx context.Context, e Executor, instance string, ttl time.Duration) error
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

// OutboxStats is the size of an outbox.
type OutboxStats struct {
	// Pending rows wait to be published, including rows waiting for a
	// retry after a failure.
	Pending int64
	// Dead rows exhausted their attempts.
	Dead int64
	// OldestPendingAge is the age of the pending row with the lowest id
	// by the database's clock (it stands in for the oldest row so that
	// the age costs one index lookup), 0 when nothing is pending, and
	// negative when the database cannot tell.
	OldestPendingAge time.Duration
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
	// Config.WatchInterval and reads the outbox only when it moved.
	HighWaterMark bool
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
	Limit int
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
}

// DeadLetter is a row that exhausted its attempts.
type DeadLetter struct {
	OutboxRow
	LastError string
	CreatedAt time.Time
	DeadAt    time.Time
}
