package mysql

import (
	"math"
	"slices"
	"strconv"
	"time"

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
	ms = append(ms, sqladapters.Migration{
		Version: 4,
		Name:    "error fingerprints and requeue times",
		Statements: append(d.alterIfMissing("error_fp",
			// A failure stores its error's fingerprint (the first 16 bytes
			// of its SHA-256, sqladapters.FingerprintError), so that the
			// dead letters of one error are found through dead_fp_idx and
			// addressed by it; a requeue stores its time, from which the
			// age of a pending row counts. MySQL has no partial indexes:
			// the index holds every row, the pending ones under state 0.
			// Processes of this version record failures with a
			// fingerprint: apply it before they start, or let them run
			// Migrate at start. Older processes work on it unchanged.
			`ALTER TABLE `+d.outbox+` ADD COLUMN error_fp BINARY(16) NULL, ADD COLUMN requeued_at DATETIME(6) NULL, ADD KEY dead_fp_idx (state, error_fp, id)`),
			// Rows that failed before: the retrying and the dead ones.
			`UPDATE `+d.outbox+` SET error_fp = `+fingerprintSQL(`last_error`)+` WHERE last_error IS NOT NULL AND error_fp IS NULL`),
	})
	ms = append(ms, sqladapters.Migration{
		Version:    5,
		Name:       "dead letters and kept rows in tables of their own",
		Statements: d.ownTables(),
	})
	ms = append(ms, sqladapters.Migration{
		Version: 6,
		Name:    "dead letters that hold their keys",
		// A dead letter recorded by a forwarder with
		// Config.DeadLetterHoldsKey holds its key: the pending read
		// leaves out the key's later rows while it is there, looking the
		// key's hash up in hold_idx. MySQL has no partial indexes: the
		// index holds every dead letter, those that hold their key under
		// holds = 1. Both changes run in place, without copying the
		// table. Processes of this version read the column (status, dead
		// letters): apply it before they start, or let them run Migrate
		// at start. Older processes work on it unchanged.
		Statements: d.alterIfMissingIn(d.opts.OutboxTable+"_dead", "holds",
			`ALTER TABLE `+d.dead+` ADD COLUMN holds BOOLEAN NOT NULL DEFAULT FALSE, ADD KEY hold_idx (holds, key_hash, id)`),
	})
	ms = append(ms, sqladapters.Migration{
		Version:    7,
		Name:       "scheduled messages",
		Statements: d.scheduledTable(),
	})
	ms = append(ms, sqladapters.Migration{
		Version: 8,
		Name:    "settings of the live forwarder instances",
		// Each instance records the settings every instance of the outbox
		// must agree on (HeartbeatSettings). The members table holds one
		// short row per live instance, so adding the column costs nothing
		// however the server adds it, and processes of earlier versions,
		// which never name it, work on unchanged: their rows hold none.
		Statements: d.alterIfMissingIn(d.opts.OutboxTable+"_members", "settings",
			`ALTER TABLE `+d.members+` ADD COLUMN settings TEXT NULL`),
	})
	if d.opts.WithoutInbox {
		ms = slices.DeleteFunc(ms, func(m sqladapters.Migration) bool { return m.Version == inboxVersion })
	}
	return ms
}

// messageColumns are the columns a message keeps in every table it passes
// through, in this order.
const messageColumns = "id, topic, uuid, payload, metadata, `key`, key_hash, created_at"

// messageColumnsDDL are the columns of messageColumns after id, as the
// tables of dead letters and kept rows declare them; their rows keep the
// ids they had in the outbox.
const messageColumnsDDL = `
	topic        LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
	uuid         LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
	payload      LONGBLOB     NOT NULL,
	metadata     LONGTEXT     NOT NULL,
	` + "`key`" + `        LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
	key_hash     INT          NOT NULL,
	created_at   DATETIME(6)  NOT NULL,`

// ownTables returns the statements of version 5: the tables of dead
// letters, kept rows and retry markers, the move of the outbox's dead and
// kept rows into them, and the end of the outbox's secondary indexes.
//
// The outbox then holds only rows that still have to go, and an insert
// maintains its primary key alone. MySQL has no partial indexes, so the
// rows waiting for a retry are found through a table of markers instead
// of an index of the outbox (see SelectPending). The generated columns
// state and retry_hash stay, unindexed: dropping a stored column copies
// the table.
//
// MySQL commits every DDL statement on its own: each statement finds its
// work done when run again, and a move inserts what is missing before it
// deletes. The moves lock the rows they move; dropping an index is an
// in-place change that lets inserts go on. Stop forwarders of earlier
// versions before applying it: they would mark rows dead or forwarded in
// the outbox, where this version no longer looks for them.
func (d *sqlDialect) ownTables() []string {
	stmts := []string{
		`CREATE TABLE IF NOT EXISTS ` + d.dead + ` (
	id           BIGINT       NOT NULL,` + messageColumnsDDL + `
	attempts     INT          NOT NULL,
	last_error   TEXT         NULL,
	error_fp     BINARY(16)   NULL,
	dead_at      DATETIME(6)  NOT NULL,
	PRIMARY KEY (id),
	KEY fp_idx (error_fp, id)
)` + tableOptions,
		`CREATE TABLE IF NOT EXISTS ` + d.kept + ` (
	id           BIGINT       NOT NULL,` + messageColumnsDDL + `
	published_at DATETIME(6)  NOT NULL,
	PRIMARY KEY (id)
)` + tableOptions,
		// One marker per keyed row waiting for a retry, by key hash.
		`CREATE TABLE IF NOT EXISTS ` + d.retries + ` (
	key_hash        INT          NOT NULL,
	id              BIGINT       NOT NULL,
	next_attempt_at DATETIME(6)  NOT NULL,
	PRIMARY KEY (key_hash, id)
)` + tableOptions,
		`INSERT INTO ` + d.dead + ` (` + messageColumns + `, attempts, last_error, error_fp, dead_at)
SELECT ` + messageColumns + `, attempts, last_error, error_fp, dead_at FROM ` + d.outbox + ` WHERE state = ` + stateDead + `
ON DUPLICATE KEY UPDATE id = ` + d.dead + `.id`,
		`DELETE FROM ` + d.outbox + ` WHERE state = ` + stateDead,
		`INSERT INTO ` + d.kept + ` (` + messageColumns + `, published_at)
SELECT ` + messageColumns + `, published_at FROM ` + d.outbox + ` WHERE state = ` + statePublished + `
ON DUPLICATE KEY UPDATE id = ` + d.kept + `.id`,
		`DELETE FROM ` + d.outbox + ` WHERE state = ` + statePublished,
		`INSERT INTO ` + d.retries + ` (key_hash, id, next_attempt_at)
SELECT key_hash, id, next_attempt_at FROM ` + d.outbox + " WHERE attempts > 0 AND `key` IS NOT NULL" + `
ON DUPLICATE KEY UPDATE next_attempt_at = ` + d.retries + `.next_attempt_at`,
	}
	for _, index := range []string{"state_idx", "retry_idx", "dead_fp_idx"} {
		stmts = append(stmts, d.alterWhen(`(SELECT COUNT(*) FROM information_schema.statistics
	WHERE table_schema = `+d.schemaExpr()+` AND LOWER(table_name) = LOWER('`+d.opts.OutboxTable+`') AND index_name = '`+index+`') > 0`,
			`ALTER TABLE `+d.outbox+` DROP INDEX `+index)...)
	}
	return stmts
}

// fingerprintSQL computes sqladapters.FingerprintError of the text
// expression t in SQL: the first 16 bytes of the SHA-256 of its utf8mb4
// (UTF-8) bytes.
func fingerprintSQL(t string) string {
	return `UNHEX(LEFT(SHA2(` + t + `, 256), 32))`
}

// alterIfMissing returns the statements that run alter when the outbox
// has no column named column, and do nothing when it has. MySQL has no
// ADD COLUMN IF NOT EXISTS (MariaDB has), and a migration's statements
// must be idempotent here, where DDL commits on its own: the statement is
// chosen in SQL and run as a prepared statement. The table names are
// validated identifiers, so they embed in a string literal as they are.
func (d *sqlDialect) alterIfMissing(column, alter string) []string {
	return d.alterIfMissingIn(d.opts.OutboxTable, column, alter)
}

// alterIfMissingIn is alterIfMissing for the table named table (unquoted,
// unqualified).
func (d *sqlDialect) alterIfMissingIn(table, column, alter string) []string {
	return d.alterWhen(`(SELECT COUNT(*) FROM information_schema.columns
	WHERE table_schema = `+d.schemaExpr()+` AND LOWER(table_name) = LOWER('`+table+`') AND column_name = '`+column+`') = 0`, alter)
}

// alterWhen returns the statements that run alter when the SQL condition
// cond holds, and do nothing otherwise (see alterIfMissing). alter must
// hold no single quote.
func (d *sqlDialect) alterWhen(cond, alter string) []string {
	return []string{
		`SET @millbox_ddl = IF(` + cond + `, '` + alter + `', 'DO 0')`,
		`PREPARE millbox_ddl FROM @millbox_ddl`,
		`EXECUTE millbox_ddl`,
		`DEALLOCATE PREPARE millbox_ddl`,
	}
}

// schemaExpr is the SQL of the database holding the tables.
func (d *sqlDialect) schemaExpr() string {
	if d.opts.Database != "" {
		return `'` + d.opts.Database + `'`
	}
	return `DATABASE()`
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
	return migrationLock(db, table, d.opts.MigrationLockTimeout)
}

// migrationLock returns the statements taking and releasing the named
// lock of lockName for db (nil for the connection's database) and name,
// waiting at most timeout (see LockMigrations).
func migrationLock(db any, name string, timeout time.Duration) (lock, unlock sqladapters.Query) {
	secs := int64(math.Ceil(timeout.Seconds()))
	if secs < 1 {
		secs = 1
	}
	return sqladapters.Query{
			SQL: `SET @millbox_migration_lock = 9223372036854775807 + IF(IF(IS_USED_LOCK(` + lockName + `) <=> CONNECTION_ID(), 1, GET_LOCK(` + lockName + `, ?)) = 1, 0,
	LENGTH('millbox: another migrator holds the migration lock, gave up waiting after MigrationLockTimeout'))`,
			Args: []any{db, name, db, name, secs},
		}, sqladapters.Query{
			SQL:  `SET @millbox_migration_lock = RELEASE_LOCK(` + lockName + `)`,
			Args: []any{db, name},
		}
}

func (d *sqlDialect) lockArgs() (db any, table string) {
	if d.opts.Database != "" {
		db = d.opts.Database
	}
	return db, d.opts.OutboxTable
}

// CreateSchema creates Options.Database, when set.
func (d *sqlDialect) CreateSchema() []sqladapters.Query {
	if d.opts.Database == "" {
		return nil
	}
	return []sqladapters.Query{{SQL: `CREATE DATABASE IF NOT EXISTS ` + quote(d.opts.Database) + ` CHARACTER SET utf8mb4`}}
}

// ScriptNote says that the statements may run again: each finds its work
// done, as Migrate needs where DDL commits on its own.
func (d *sqlDialect) ScriptNote() string { return "Statements are idempotent." }

// CreateMigrationsTable creates the database (when set) and the version
// table.
func (d *sqlDialect) CreateMigrationsTable() []sqladapters.Query {
	return append(d.CreateSchema(), sqladapters.Query{SQL: `CREATE TABLE IF NOT EXISTS ` + d.migrate + ` (
	version    INT          NOT NULL,
	name       VARCHAR(255) NOT NULL,
	applied_at DATETIME(6)  NOT NULL,
	PRIMARY KEY (version)
)` + tableOptions})
}

// Schema returns Options.Database, and the statement selecting the
// connection's default database, which unqualified names resolve to, for
// when it is "".
func (d *sqlDialect) Schema() (string, sqladapters.Query) {
	return d.opts.Database, sqladapters.Query{SQL: `SELECT DATABASE()`}
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
