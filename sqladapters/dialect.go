package sqladapters

import (
	"time"
)

// Dialect builds the SQL of one database for every millbox operation. It
// never executes anything: callers run the returned Query values on an
// Executor. A Dialect value also carries the validated table names, so one
// value describes one millbox installation (outbox, leases, inbox).
//
// Implementations: sqladapters/postgres, sqladapters/mysql,
// sqladapters/sqlite.
type Dialect interface {
	// Name is a short name of the database, such as "postgres".
	Name() string
	// Features reports what the database can and cannot do.
	Features() Features
	// OutboxTable is the quoted, qualified name of the outbox table.
	OutboxTable() string
	// InboxTable is the quoted, qualified name of the inbox table.
	InboxTable() string
	// ClassifyError maps a driver error to millbox's errors: a missing
	// table becomes a *MissingTableError, a unique-key violation wraps
	// ErrDuplicate. Other errors are returned unchanged.
	ClassifyError(err error) error

	MigrationDialect
	OutboxDialect
	ForwarderDialect
	InboxDialect
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
	// ExcludeInSQL is true when SelectPending applies
	// PendingQuery.Exclude. All three databases do: Postgres hashes the
	// list once per read (NOT IN over a subquery), MySQL and SQLite get
	// it inline. Where it is false the forwarder reads that many more
	// rows and drops those in flight, which costs the database and the
	// forwarder the transfer of rows it already holds.
	ExcludeInSQL bool
}

// Migration is one versioned step of the millbox schema.
type Migration struct {
	Version    int
	Name       string
	Statements []string
}

// MigrationDialect builds the SQL that creates and upgrades millbox's tables.
type MigrationDialect interface {
	// Migrations lists every migration in version order.
	Migrations() []Migration
	// LockMigrations returns the statement that serializes concurrent
	// migrators (an advisory lock) and the one that releases it. Unlock is
	// a zero Query when the lock ends with the transaction.
	LockMigrations() (lock, unlock Query)
	// CreateMigrationsTable creates the table recording applied versions
	// (and the schema holding it, where the database has schemas).
	CreateMigrationsTable() []Query
	// AppliedMigrations selects the applied versions (one int column).
	AppliedMigrations() Query
	// RecordMigration records version as applied.
	RecordMigration(version int, name string) Query
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

// OutboxDialect builds the outbox insert.
type OutboxDialect interface {
	// InsertOutbox inserts msgs (at least one) in as few statements as the
	// database's parameter limit allows, in order: ids grow with the
	// position in msgs. When the database supports it, the statement also
	// wakes listening forwarders on commit.
	InsertOutbox(msgs []OutboxMessage) []Query
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
	// clock), when the dialect reports it (PendingAges); else zero.
	Age time.Duration
}

// PendingQuery selects the outbox rows a forwarder may publish next.
type PendingQuery struct {
	// Partitions is the total number of partitions; Owned lists the ones
	// to read. Owned == nil reads every partition.
	Partitions int
	Owned      []int
	// Exclude lists ids not to return: rows the forwarder has in flight.
	// A dialect whose Features().ExcludeInSQL is false ignores it; the
	// caller then raises Limit by len(Exclude) and drops them itself.
	Exclude []int64
	Limit   int
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

// HighWaterMark is implemented by a dialect that can tell cheaply whether
// rows were added to the outbox: the query returns one integer that grows
// when a row is inserted (the position of the outbox's id sequence). A
// forwarder without notifications runs it every Config.WatchInterval and
// reads the outbox only when it changed.
type HighWaterMark interface {
	HighWaterMark() Query
}

// PendingAges is implemented by a dialect that can return each pending
// row's age with it: SelectPendingWithAge returns SelectPending's columns
// and an eighth, the row's age in microseconds by the database's clock.
type PendingAges interface {
	SelectPendingWithAge(q PendingQuery) Query
}

// PendingReadSetup is implemented by a dialect whose reads of a large
// backlog need transaction-local settings. While draining a backlog (after
// a read that filled its batch) the forwarder runs SelectPending in a
// read-only transaction, after the statements PendingReadSetup returns;
// shorter reads run on their own, without the transaction's round trips.
type PendingReadSetup interface {
	PendingReadSetup() []Query
}

// ForwarderDialect builds the SQL the forwarder and its operations API run.
//
// Pending rows are returned in id order, and a row whose key has an earlier
// row waiting for a retry is not returned: that keeps per-key order while a
// key is backing off.
type ForwarderDialect interface {
	// SelectPending returns columns id, topic, uuid, payload, metadata,
	// key (NULL when empty), attempts, in id order.
	SelectPending(q PendingQuery) Query
	// CompleteForwarded removes published rows, or marks them published
	// when keep is true.
	CompleteForwarded(ids []int64, keep bool) Query
	// RecordFailure stores a failed attempt.
	RecordFailure(f Failure) Query
	// ListDeadLetters returns columns id, topic, uuid, payload, metadata,
	// key, attempts, last_error, created_at, dead_at of dead rows with
	// id > afterID, in id order.
	ListDeadLetters(afterID int64, limit int) Query
	// CountOutbox selects two int columns: the number of pending rows
	// (including rows waiting for a retry) and of dead rows.
	CountOutbox() Query
	// RequeueDeadLetters makes dead rows pending again with zero attempts.
	// ids == nil requeues every dead row.
	RequeueDeadLetters(ids []int64) Query
	// NotifyChannel is the channel the outbox insert notifies on commit,
	// or "" when the database has no notifications.
	NotifyChannel() string

	// EnsurePartitions creates lease rows 0..n-1 when missing.
	EnsurePartitions(n int) []Query
	// CountPartitions selects the number of lease rows (one int column).
	CountPartitions() Query
	// Heartbeat records that instance is alive for ttl.
	Heartbeat(instance string, ttl time.Duration) Query
	// CountMembers selects the number of live instances (one int column).
	CountMembers() Query
	// RemoveMember deletes instance and every expired member.
	RemoveMember(instance string) Query
	// ClaimPartitions gives instance up to max partitions that are free or
	// whose lease expired, for ttl.
	ClaimPartitions(instance string, ttl time.Duration, max int) Query
	// RenewPartitions extends the unexpired leases of instance by ttl.
	RenewPartitions(instance string, ttl time.Duration) Query
	// OwnedPartitions selects the partitions instance holds unexpired
	// leases on (one int column), ascending.
	OwnedPartitions(instance string) Query
	// ReleasePartitions frees the given partitions of instance.
	ReleasePartitions(instance string, partitions []int) Query
}

// InboxDialect builds the SQL of the inbox.
type InboxDialect interface {
	// InsertInbox records (consumer, messageID). It affects one row the
	// first time and zero rows for a duplicate. Under concurrency it
	// waits for a transaction holding the same key and then reports
	// duplicate if that transaction committed.
	InsertInbox(consumer, messageID string) Query
	// DeleteInboxBefore deletes at most limit rows received before t.
	DeleteInboxBefore(t time.Time, limit int) Query
}
