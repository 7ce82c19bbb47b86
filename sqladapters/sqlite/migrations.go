package sqlite

import (
	"slices"

	"github.com/millbox/millbox/sqladapters"
)

// Migrations lists the schema versions.
func (d *sqlDialect) Migrations() []sqladapters.Migration {
	o, t := d.outbox, d.opts.OutboxTable
	ms := []sqladapters.Migration{{
		Version: 1,
		Name:    "outbox and leases",
		Statements: []string{
			// AUTOINCREMENT: ids are never reused after deletes (see the
			// package documentation).
			`CREATE TABLE IF NOT EXISTS ` + o + ` (
	id              INTEGER PRIMARY KEY AUTOINCREMENT,
	topic           TEXT      NOT NULL,
	uuid            TEXT      NOT NULL,
	payload         BLOB      NOT NULL,
	metadata        TEXT      NOT NULL DEFAULT '{}',
	key             TEXT,
	key_hash        INTEGER   NOT NULL DEFAULT 0,
	created_at      TIMESTAMP NOT NULL DEFAULT (` + now + `),
	attempts        INTEGER   NOT NULL DEFAULT 0,
	last_error      TEXT,
	next_attempt_at TIMESTAMP NOT NULL DEFAULT (` + now + `),
	dead_at         TIMESTAMP,
	published_at    TIMESTAMP
)`,
			// The forwarder reads pending rows in id order through this index.
			`CREATE INDEX IF NOT EXISTS ` + quote(t+"_pending_idx") + ` ON ` + o +
				` (id) WHERE dead_at IS NULL AND published_at IS NULL`,
			// Rows that failed at least once; a key with such a row waits for it.
			`CREATE INDEX IF NOT EXISTS ` + quote(t+"_retry_idx") + ` ON ` + o +
				` (key, id) WHERE attempts > 0 AND dead_at IS NULL AND published_at IS NULL`,
			`CREATE INDEX IF NOT EXISTS ` + quote(t+"_dead_idx") + ` ON ` + o +
				` (id) WHERE dead_at IS NOT NULL`,
			`CREATE TABLE IF NOT EXISTS ` + d.leases + ` (
	partition  INTEGER PRIMARY KEY,
	owner      TEXT,
	expires_at TIMESTAMP
)`,
			// WITHOUT ROWID: the primary key is the table, so an insert
			// writes one b-tree instead of a table and its key index.
			`CREATE TABLE IF NOT EXISTS ` + d.members + ` (
	instance   TEXT PRIMARY KEY,
	expires_at TIMESTAMP NOT NULL
) WITHOUT ROWID`,
		},
	}, {
		Version: 2,
		Name:    "retry index on the key hash",
		Statements: []string{
			// Version 1 indexed the key itself: every entry carried a copy
			// of a key of any length. The index now holds the fixed-width
			// key hash; the backoff check compares the full keys of the
			// rows it finds. It holds only rows waiting for a retry, so it
			// is rebuilt in moments.
			`DROP INDEX IF EXISTS ` + quote(t+"_retry_idx"),
			`CREATE INDEX IF NOT EXISTS ` + quote(t+"_retry_idx") + ` ON ` + o +
				` (key_hash, id) WHERE attempts > 0 AND dead_at IS NULL AND published_at IS NULL`,
		},
	}, {
		// Version 1 created the inbox of installations made before
		// version 3 existed; for them this changes nothing.
		Version: 3,
		Name:    "inbox",
		Statements: []string{
			`CREATE TABLE IF NOT EXISTS ` + d.inbox + ` (
	consumer    TEXT      NOT NULL,
	message_id  TEXT      NOT NULL,
	received_at TIMESTAMP NOT NULL DEFAULT (` + now + `),
	PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID`,
			`CREATE INDEX IF NOT EXISTS ` + quote(d.opts.InboxTable+"_received_idx") + ` ON ` + d.inbox + ` (received_at)`,
		},
	}}
	ms = append(ms, sqladapters.Migration{
		Version: fingerprintVersion,
		Name:    "error fingerprints and requeue times",
		Statements: []string{
			// A failure stores its error's fingerprint (the first 16 bytes
			// of its SHA-256, sqladapters.FingerprintError), so that the
			// dead letters of one error are found through dead_fp_idx and
			// addressed by it; a requeue stores its time, from which the
			// age of a pending row counts. SQLite cannot add a column
			// only if it is missing: Migrate applies this version once,
			// in a transaction, and then fingerprints the errors recorded
			// before it (see FingerprintVersion), which SQLite cannot hash
			// itself.
			// Processes of this version record failures with a
			// fingerprint: apply it before they start, or let them run
			// Migrate at start. Older processes work on it unchanged.
			`ALTER TABLE ` + o + ` ADD COLUMN error_fp BLOB`,
			`ALTER TABLE ` + o + ` ADD COLUMN requeued_at TIMESTAMP`,
			`CREATE INDEX IF NOT EXISTS ` + quote(t+"_dead_fp_idx") + ` ON ` + o + ` (error_fp, id) WHERE dead_at IS NOT NULL`,
		},
	})
	ms = append(ms, sqladapters.Migration{
		Version: 5,
		Name:    "dead letters and kept rows in tables of their own",
		// The outbox then holds only rows that still have to go; the
		// insert maintains the table's b-tree alone (the retry index is
		// partial and holds only rows that failed). Its dead_at and
		// published_at columns stay, always NULL, because the retry
		// index's predicate names them. Rows keep their ids in every
		// table. Stop forwarders of earlier versions before applying it:
		// they would mark rows dead or forwarded in the outbox, where this
		// version no longer looks for them.
		Statements: []string{
			`CREATE TABLE IF NOT EXISTS ` + d.dead + ` (
	id          INTEGER   PRIMARY KEY,` + messageColumnsDDL + `
	attempts    INTEGER   NOT NULL,
	last_error  TEXT,
	error_fp    BLOB,
	dead_at     TIMESTAMP NOT NULL DEFAULT (` + now + `)
)`,
			`CREATE INDEX IF NOT EXISTS ` + quote(t+"_deadfp_idx") + ` ON ` + d.dead + ` (error_fp, id)`,
			`CREATE TABLE IF NOT EXISTS ` + d.kept + ` (
	id           INTEGER   PRIMARY KEY,` + messageColumnsDDL + `
	published_at TIMESTAMP NOT NULL DEFAULT (` + now + `)
)`,
			`INSERT INTO ` + d.dead + ` (` + messageColumns + `, attempts, last_error, error_fp, dead_at)
SELECT ` + messageColumns + `, attempts, last_error, error_fp, dead_at FROM ` + o + ` WHERE dead_at IS NOT NULL AND published_at IS NULL
ON CONFLICT (id) DO NOTHING`,
			`DELETE FROM ` + o + ` WHERE dead_at IS NOT NULL AND published_at IS NULL`,
			`INSERT INTO ` + d.kept + ` (` + messageColumns + `, published_at)
SELECT ` + messageColumns + `, published_at FROM ` + o + ` WHERE published_at IS NOT NULL
ON CONFLICT (id) DO NOTHING`,
			`DELETE FROM ` + o + ` WHERE published_at IS NOT NULL`,
			`DROP INDEX IF EXISTS ` + quote(t+"_pending_idx"),
			`DROP INDEX IF EXISTS ` + quote(t+"_dead_idx"),
			`DROP INDEX IF EXISTS ` + quote(t+"_dead_fp_idx"),
		},
	})
	ms = append(ms, sqladapters.Migration{
		Version: 6,
		Name:    "dead letters that hold their keys",
		// A dead letter recorded by a forwarder with
		// Config.DeadLetterHoldsKey holds its key: the pending read
		// leaves out the key's later rows while it is there, looking the
		// key's hash up in the hold index, which holds only such dead
		// letters. Processes of this version read the column (status,
		// dead letters): apply it before they start, or let them run
		// Migrate at start. Older processes work on it unchanged.
		Statements: []string{
			`ALTER TABLE ` + d.dead + ` ADD COLUMN holds INTEGER NOT NULL DEFAULT 0`,
			`CREATE INDEX IF NOT EXISTS ` + quote(t+"_deadhold_idx") + ` ON ` + d.dead + ` (key_hash, id) WHERE holds = 1`,
		},
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
		// must agree on (HeartbeatSettings). Processes of earlier
		// versions, which never name the column, work on unchanged: their
		// rows hold none.
		Statements: []string{
			`ALTER TABLE ` + d.members + ` ADD COLUMN settings TEXT`,
		},
	})
	if d.opts.WithoutInbox {
		ms = slices.DeleteFunc(ms, func(m sqladapters.Migration) bool { return m.Version == inboxVersion })
	}
	return ms
}

// messageColumns are the columns a message keeps in every table it passes
// through, in this order.
const messageColumns = `id, topic, uuid, payload, metadata, key, key_hash, created_at`

// messageColumnsDDL are the columns of messageColumns after id, as the
// tables of dead letters and kept rows declare them.
const messageColumnsDDL = `
	topic       TEXT      NOT NULL,
	uuid        TEXT      NOT NULL,
	payload     BLOB      NOT NULL,
	metadata    TEXT      NOT NULL,
	key         TEXT,
	key_hash    INTEGER   NOT NULL,
	created_at  TIMESTAMP NOT NULL,`

// fingerprintVersion is the migration that adds error fingerprints.
const fingerprintVersion = 4

// FingerprintVersion is the migration after which Migrate fingerprints
// the errors recorded before it.
func (d *sqlDialect) FingerprintVersion() int { return fingerprintVersion }

// UnfingerprintedErrors selects the rows that failed before error
// fingerprints existed.
func (d *sqlDialect) UnfingerprintedErrors(afterID int64, limit int) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT id, last_error FROM ` + d.outbox + ` WHERE last_error IS NOT NULL AND error_fp IS NULL AND id > ? ORDER BY id LIMIT ?`,
		Args: []any{afterID, limit},
	}
}

// SetFingerprint stores the fingerprint of one row's error.
func (d *sqlDialect) SetFingerprint(id int64, fp sqladapters.ErrorFingerprint) sqladapters.Query {
	return sqladapters.Query{SQL: `UPDATE ` + d.outbox + ` SET error_fp = ? WHERE id = ?`, Args: []any{fp[:], id}}
}

// Schema returns "main": SQLite has one database per file, so named.
func (d *sqlDialect) Schema() (string, sqladapters.Query) { return "main", sqladapters.Query{} }

// inboxVersion is the migration that creates the inbox.
const inboxVersion = 3

// LockMigrations makes the migration transaction a writer from its first
// statement, which is how SQLite serializes migrators: it has no advisory
// locks, and a deferred transaction that reads the applied versions and
// then writes fails with SQLITE_BUSY, without waiting, when another
// migrator wrote first. A write as the first statement instead waits for the
// lock under the busy timeout, like BEGIN IMMEDIATE, whatever the driver's
// transaction mode. The lock statement creates a scratch table, which is
// always a write (a no-op CREATE TABLE IF NOT EXISTS is not); the unlock
// statement drops it in the same transaction, so it is never committed.
// A second migrator waits, then finds the versions applied.
func (d *sqlDialect) LockMigrations() (lock, unlock sqladapters.Query) {
	return sqladapters.Query{SQL: `CREATE TABLE ` + d.migrateLock + ` (held INTEGER)`},
		sqladapters.Query{SQL: `DROP TABLE ` + d.migrateLock}
}

// CreateSchema returns none: an SQLite database is its file.
func (d *sqlDialect) CreateSchema() []sqladapters.Query { return nil }

// ScriptNote says that each version must run once: SQLite cannot add a
// column only where it is missing.
func (d *sqlDialect) ScriptNote() string {
	return "Apply each version once: SQLite cannot add a column only if it is missing."
}

// CreateMigrationsTable creates the version table.
func (d *sqlDialect) CreateMigrationsTable() []sqladapters.Query {
	return []sqladapters.Query{{SQL: `CREATE TABLE IF NOT EXISTS ` + d.migrate + ` (
	version    INTEGER PRIMARY KEY,
	name       TEXT      NOT NULL,
	applied_at TIMESTAMP NOT NULL DEFAULT (` + now + `)
)`}}
}

// AppliedMigrations selects the applied versions.
func (d *sqlDialect) AppliedMigrations() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT version FROM ` + d.migrate + ` ORDER BY version`}
}

// RecordMigration records an applied version.
func (d *sqlDialect) RecordMigration(version int, name string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `INSERT INTO ` + d.migrate + ` (version, name) VALUES (?, ?) ON CONFLICT (version) DO NOTHING`,
		Args: []any{version, name},
	}
}
