package mysql

import (
	"math"
	"slices"
	"strconv"

	"github.com/millbox/millbox/sqladapters"
)

// tableOptions makes every table InnoDB (row locks, crash safety) with
// utf8mb4 text compared byte by byte.
const tableOptions = ` ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`

// Migrations lists the schema versions.
//
// MySQL commits every DDL statement on its own, so a migration that fails
// halfway leaves its earlier statements applied and unrecorded; Migrate
// runs it again. Every statement is therefore idempotent: CREATE TABLE IF
// NOT EXISTS with the indexes inline (MySQL has no CREATE INDEX IF NOT
// EXISTS).
func (d *sqlDialect) Migrations() []sqladapters.Migration {
	ms := []sqladapters.Migration{{
		Version: 1,
		Name:    "outbox and leases",
		Statements: []string{
			// MySQL has no partial indexes; generated columns stand in for
			// them. state is derived from published_at and dead_at (0
			// pending, 1 dead, 2 published) so that one index serves the
			// pending scan and the dead-letter pages in id order. key_hash
			// in state_idx lets the scan test a row's partition in the
			// index (index condition pushdown) instead of fetching the rows
			// of partitions other instances own.
			// retry_hash is the key hash of a pending row that has failed at
			// least once and NULL otherwise, so retry_idx holds only the rows
			// waiting for a retry: a key with such a row holds its later rows
			// back, and checking that costs one lookup that finds nothing in
			// the common case, however large the backlog. Texts are
			// utf8mb4_bin, payloads any bytes.
			`CREATE TABLE IF NOT EXISTS ` + d.outbox + ` (
	id              BIGINT       NOT NULL AUTO_INCREMENT,
	topic           TEXT         NOT NULL,
	uuid            TEXT         NOT NULL,
	payload         LONGBLOB     NOT NULL,
	metadata        LONGTEXT     NOT NULL,
	` + "`key`" + `           TEXT         NULL,
	key_hash        INT          NOT NULL DEFAULT 0,
	created_at      DATETIME(6)  NOT NULL,
	attempts        INT          NOT NULL DEFAULT 0,
	last_error      TEXT         NULL,
	next_attempt_at DATETIME(6)  NOT NULL,
	dead_at         DATETIME(6)  NULL,
	published_at    DATETIME(6)  NULL,
	state           TINYINT GENERATED ALWAYS AS (CASE WHEN published_at IS NOT NULL THEN 2 WHEN dead_at IS NOT NULL THEN 1 ELSE 0 END) STORED,
	retry_hash      INT GENERATED ALWAYS AS (CASE WHEN attempts > 0 AND published_at IS NULL AND dead_at IS NULL THEN key_hash END) STORED,
	PRIMARY KEY (id),
	KEY state_idx (state, id, key_hash),
	KEY retry_idx (retry_hash, next_attempt_at)
)` + tableOptions,
			`CREATE TABLE IF NOT EXISTS ` + d.leases + ` (
	` + "`partition`" + ` INT            NOT NULL,
	owner       VARBINARY(` + strconv.Itoa(maxOwnerBytes) + `) NULL,
	expires_at  DATETIME(6)    NULL,
	PRIMARY KEY (` + "`partition`" + `)
)` + tableOptions,
			`CREATE TABLE IF NOT EXISTS ` + d.members + ` (
	instance   VARBINARY(` + strconv.Itoa(maxOwnerBytes) + `) NOT NULL,
	expires_at DATETIME(6)    NOT NULL,
	PRIMARY KEY (instance)
)` + tableOptions,
		},
	}, {
		Version: 2,
		Name:    "long topics, UUIDs and ordering keys",
		Statements: []string{
			// TEXT holds 65,535 bytes, so a longer ordering key (or topic,
			// or UUID) failed the insert. LONGTEXT takes the same room per
			// row; what bounds a message now is max_allowed_packet (see
			// Dialect.MaxMessageBytes). No index holds these columns: the
			// backoff check finds rows by key_hash and compares the keys.
			// Changing the column type may copy the table, which the
			// forwarder keeps small. Running it again changes nothing.
			`ALTER TABLE ` + d.outbox + `
	MODIFY topic  LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
	MODIFY uuid   LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
	MODIFY ` + "`key`" + ` LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL`,
		},
	}, {
		// Version 1 created the inbox of installations made before
		// version 3 existed; for them this changes nothing.
		Version: 3,
		Name:    "inbox",
		Statements: []string{
			// VARBINARY keys compare byte by byte: no collation folds two
			// message ids into one, and trailing spaces count.
			`CREATE TABLE IF NOT EXISTS ` + d.inbox + ` (
	consumer    VARBINARY(` + strconv.Itoa(maxConsumerBytes) + `) NOT NULL,
	message_id  VARBINARY(` + strconv.Itoa(maxMessageIDBytes) + `) NOT NULL,
	received_at DATETIME(6)    NOT NULL,
	PRIMARY KEY (consumer, message_id),
	KEY received_idx (received_at)
)` + tableOptions,
		},
	}}
	if d.opts.WithoutInbox {
		ms = slices.DeleteFunc(ms, func(m sqladapters.Migration) bool { return m.Version == inboxVersion })
	}
	return ms
}

// inboxVersion is the migration that creates the inbox.
const inboxVersion = 3

// lockName is the name of the migration lock: one per database and outbox
// table, hashed to stay within the 64 characters GET_LOCK accepts. Its
// arguments are the database (nil for the connection's) and the table.
const lockName = `CONCAT('millbox_migrate_', SHA1(CONCAT(COALESCE(?, DATABASE(), ''), '.', ?)))`

// LockMigrations takes a named lock (GET_LOCK) for the database and outbox
// table, waiting at most Options.MigrationLockTimeout, and releases it
// with RELEASE_LOCK.
//
// Such a lock belongs to the connection, not to the transaction, which
// MySQL's DDL commits anyway; Migrate holds one connection throughout
// because it runs in a transaction, and releases the lock on failure too.
// GET_LOCK returns 0 on timeout instead of failing, so the statement turns
// that into an error that names the lock (an out-of-range addition). It is
// a SET rather than a SELECT because the driver, executing a prepared
// SELECT whose row fails, waits forever. A connection that still holds the
// lock from an interrupted run takes it again without counting twice, so
// one release frees it.
func (d *sqlDialect) LockMigrations() (lock, unlock sqladapters.Query) {
	db, table := d.lockArgs()
	secs := int64(math.Ceil(d.opts.MigrationLockTimeout.Seconds()))
	if secs < 1 {
		secs = 1
	}
	return sqladapters.Query{
			SQL: `SET @millbox_migration_lock = 9223372036854775807 + IF(IF(IS_USED_LOCK(` + lockName + `) <=> CONNECTION_ID(), 1, GET_LOCK(` + lockName + `, ?)) = 1, 0,
	LENGTH('millbox: another migrator holds the migration lock, gave up waiting after MigrationLockTimeout'))`,
			Args: []any{db, table, db, table, secs},
		}, sqladapters.Query{
			SQL:  `SET @millbox_migration_lock = RELEASE_LOCK(` + lockName + `)`,
			Args: []any{db, table},
		}
}

func (d *sqlDialect) lockArgs() (db any, table string) {
	if d.opts.Database != "" {
		db = d.opts.Database
	}
	return db, d.opts.OutboxTable
}

// CreateMigrationsTable creates the database (when set) and the version
// table.
func (d *sqlDialect) CreateMigrationsTable() []sqladapters.Query {
	var qs []sqladapters.Query
	if d.opts.Database != "" {
		qs = append(qs, sqladapters.Query{SQL: `CREATE DATABASE IF NOT EXISTS ` + quote(d.opts.Database) + ` CHARACTER SET utf8mb4`})
	}
	return append(qs, sqladapters.Query{SQL: `CREATE TABLE IF NOT EXISTS ` + d.migrate + ` (
	version    INT          NOT NULL,
	name       VARCHAR(255) NOT NULL,
	applied_at DATETIME(6)  NOT NULL,
	PRIMARY KEY (version)
)` + tableOptions})
}

// AppliedMigrations selects the applied versions.
func (d *sqlDialect) AppliedMigrations() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT version FROM ` + d.migrate + ` ORDER BY version`}
}

// RecordMigration records an applied version; recording it twice is a
// no-op.
func (d *sqlDialect) RecordMigration(version int, name string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `INSERT INTO ` + d.migrate + ` (version, name, applied_at) VALUES (?, ?, ` + now + `) ON DUPLICATE KEY UPDATE version = version`,
		Args: []any{version, name},
	}
}
