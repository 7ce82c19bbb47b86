package postgres

import (
	"slices"

	"github.com/millbox/millbox/sqladapters"
)

// outboxColumns are the outbox's columns after id, the same in the plain
// and the partitioned layout.
const outboxColumns = `
	topic           text        NOT NULL,
	uuid            text        NOT NULL,
	payload         bytea       NOT NULL,
	metadata        jsonb       NOT NULL DEFAULT '{}',
	key             text,
	key_hash        integer     NOT NULL DEFAULT 0,
	created_at      timestamptz NOT NULL DEFAULT now(),
	attempts        integer     NOT NULL DEFAULT 0,
	last_error      text,
	next_attempt_at timestamptz NOT NULL DEFAULT now(),
	dead_at         timestamptz,
	published_at    timestamptz`

// Migrations lists the schema versions. With Options.Partitioned,
// version 1 creates the partitioned outbox instead (see layout); every
// later version applies to both layouts, so its statements must work on
// a partitioned table too.
func (d *sqlDialect) Migrations() []sqladapters.Migration {
	o, t := d.outbox, d.opts.OutboxTable
	ms := []sqladapters.Migration{{
		Version: 1,
		Name:    "outbox and leases",
		Statements: []string{
			`CREATE TABLE IF NOT EXISTS ` + o + ` (
	id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,` + outboxColumns + `
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01)`,
			// The forwarder reads pending rows in id order through this index.
			`CREATE INDEX IF NOT EXISTS ` + quote(t+"_pending_idx") + ` ON ` + o +
				` (id) WHERE dead_at IS NULL AND published_at IS NULL`,
			// Rows that failed at least once; a key with such a row waits for it.
			`CREATE INDEX IF NOT EXISTS ` + quote(t+"_retry_idx") + ` ON ` + o +
				` (key, id) WHERE attempts > 0 AND dead_at IS NULL AND published_at IS NULL`,
			`CREATE INDEX IF NOT EXISTS ` + quote(t+"_dead_idx") + ` ON ` + o +
				` (id) WHERE dead_at IS NOT NULL`,
			`CREATE TABLE IF NOT EXISTS ` + d.leases + ` (
	partition  integer PRIMARY KEY,
	owner      text,
	expires_at timestamptz
)`,
			`CREATE TABLE IF NOT EXISTS ` + d.members + ` (
	instance   text PRIMARY KEY,
	expires_at timestamptz NOT NULL
)`,
		},
	}, {
		Version: 2,
		Name:    "retry index on the key hash",
		Statements: []string{
			// A btree entry holds at most 2,704 bytes, so version 1's
			// retry index on the key itself failed every RecordFailure of
			// a row with a longer key, and such a row was retried forever.
			// The index now holds the fixed-width key hash; the backoff
			// check compares the full keys of the rows it finds. The index
			// holds only rows waiting for a retry, so it is rebuilt in
			// moments.
			`DROP INDEX IF EXISTS ` + d.qualify(t+"_retry_idx"),
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
	consumer    text        NOT NULL,
	message_id  text        NOT NULL,
	received_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_id)
)`,
			`CREATE INDEX IF NOT EXISTS ` + quote(d.opts.InboxTable+"_received_idx") + ` ON ` + d.inbox + ` (received_at)`,
		},
	}}
	ms = append(ms, sqladapters.Migration{
		Version: 4,
		Name:    "error fingerprints and requeue times",
		Statements: []string{
			// A failure stores its error's fingerprint (the first 16 bytes
			// of its SHA-256, sqladapters.FingerprintError), so that the
			// dead letters of one error are found through an index and
			// addressed by it. A requeue stores its time, from which the
			// age of a pending row counts. Adding nullable columns without
			// a default rewrites nothing.
			// Processes of this version record failures with a
			// fingerprint: apply it before they start, or let them run
			// Migrate at start. Older processes work on it unchanged.
			`ALTER TABLE ` + o + ` ADD COLUMN IF NOT EXISTS error_fp bytea, ADD COLUMN IF NOT EXISTS requeued_at timestamptz`,
			// Rows that failed before: the retrying and the dead ones.
			`UPDATE ` + o + ` SET error_fp = ` + fingerprintSQL(`last_error`) + ` WHERE last_error IS NOT NULL AND error_fp IS NULL`,
			// The pages of one error group read this index, which holds
			// only dead rows. Building it reads the table once and blocks
			// writes meanwhile.
			`CREATE INDEX IF NOT EXISTS ` + quote(t+"_dead_fp_idx") + ` ON ` + o + ` (error_fp, id) WHERE dead_at IS NOT NULL`,
		},
	})
	ms = append(ms, sqladapters.Migration{
		Version:    5,
		Name:       "dead letters and kept rows in tables of their own",
		Statements: d.ownTables(),
	})
	ms = append(ms, sqladapters.Migration{
		Version: 6,
		Name:    "dead letters that hold their keys",
		Statements: []string{
			// A dead letter recorded by a forwarder with
			// Config.DeadLetterHoldsKey holds its key: the pending read
			// leaves out the key's later rows while it is there. Adding a
			// column with a constant default rewrites nothing.
			`ALTER TABLE ` + d.dead + ` ADD COLUMN IF NOT EXISTS holds boolean NOT NULL DEFAULT false`,
			// The pending read looks a key's hash up here for every row
			// it returns; the index holds only the dead letters that hold
			// their keys, so it stays small and is built in moments.
			// Processes of this version read the column (status, dead
			// letters): apply it before they start, or let them run
			// Migrate at start. Older processes work on it unchanged.
			`CREATE INDEX IF NOT EXISTS ` + quote(t+deadHoldSuffix) + ` ON ` + d.dead + ` (key_hash, id) WHERE holds`,
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
		Statements: []string{
			// Each instance records the settings every instance of the
			// outbox must agree on (HeartbeatSettings). A nullable column
			// without a default is added without rewriting anything, and
			// processes of earlier versions, which never name it, work on
			// unchanged: their rows hold none.
			`ALTER TABLE ` + d.members + ` ADD COLUMN IF NOT EXISTS settings text`,
		},
	})
	ms = append(ms, sqladapters.Migration{
		Version: 9,
		Name:    "count of the calls of publishers without a table",
		Statements: []string{
			// Each call of a publisher without a table draws a number
			// from it and writes it with its messages, so that a
			// change-data-capture forwarder knows, reading the table,
			// whether such a call may have committed that its stream
			// has not decoded yet (and only then waits for the stream).
			`CREATE SEQUENCE IF NOT EXISTS ` + d.emits,
		},
	})
	if d.opts.WithoutInbox {
		ms = slices.DeleteFunc(ms, func(m sqladapters.Migration) bool { return m.Version == inboxVersion })
	}
	return d.layout(ms)
}

// Suffixes of the tables of dead letters and of kept rows, and of the
// dead letters' fingerprint and hold indexes.
const (
	deadSuffix     = "_dead"
	keptSuffix     = "_kept"
	deadFPSuffix   = "_deadfp_idx"
	deadHoldSuffix = "_deadhold_idx"
)

// messageColumns are the columns a message keeps in every table it passes
// through, in this order.
const messageColumns = `id, topic, uuid, payload, metadata, key, key_hash, created_at`

// deadColumnsDDL and keptColumnsDDL are the columns of the dead letters'
// and the kept rows' tables after id. Their rows keep the ids they had in
// the outbox.
const (
	deadColumnsDDL = `
	topic       text        NOT NULL,
	uuid        text        NOT NULL,
	payload     bytea       NOT NULL,
	metadata    jsonb       NOT NULL,
	key         text,
	key_hash    integer     NOT NULL,
	created_at  timestamptz NOT NULL,
	attempts    integer     NOT NULL,
	last_error  text,
	error_fp    bytea,
	dead_at     timestamptz NOT NULL DEFAULT now()`
	keptColumnsDDL = `
	topic        text        NOT NULL,
	uuid         text        NOT NULL,
	payload      bytea       NOT NULL,
	metadata     jsonb       NOT NULL,
	key          text,
	key_hash     integer     NOT NULL,
	created_at   timestamptz NOT NULL,
	published_at timestamptz NOT NULL DEFAULT now()`
)

// ownTables returns the statements of version 5: the tables of dead
// letters and kept rows, the move of the outbox's dead and kept rows into
// them, and the end of the outbox's indexes that only those rows needed.
//
// The outbox then holds only rows that still have to go, and an insert
// maintains its primary key alone (the retry index is partial and holds
// only rows that failed). Its dead_at and published_at columns stay,
// always NULL, because the retry index's predicate names them: dropping
// them would rebuild that index with a scan of the outbox that blocks
// inserts meanwhile.
//
// The moves are single statements that lock only the rows they move, and
// the indexes are dropped last, so the migration blocks writers only for
// its last moments (dropping an index takes the outbox's exclusive lock
// until the migration commits). Every statement finds its work done when
// run again. Stop forwarders of earlier versions before applying it:
// they would mark rows dead or forwarded in the outbox, where this
// version no longer looks for them.
func (d *sqlDialect) ownTables() []string {
	t := d.opts.OutboxTable
	stmts := []string{
		`CREATE TABLE IF NOT EXISTS ` + d.dead + ` (
	id          bigint      PRIMARY KEY,` + deadColumnsDDL + `
)`,
		// The pages of one error group read this index.
		`CREATE INDEX IF NOT EXISTS ` + quote(t+deadFPSuffix) + ` ON ` + d.dead + ` (error_fp, id)`,
	}
	if d.opts.Partitioned != nil {
		stmts = append(stmts, d.partitionedKept()...)
	} else {
		stmts = append(stmts, `CREATE TABLE IF NOT EXISTS `+d.kept+` (
	id           bigint      PRIMARY KEY,`+keptColumnsDDL+`
)`)
	}
	return append(stmts,
		`WITH m AS (DELETE FROM `+d.outbox+` WHERE dead_at IS NOT NULL AND published_at IS NULL
	RETURNING `+messageColumns+`, attempts, last_error, error_fp, dead_at)
INSERT INTO `+d.dead+` (`+messageColumns+`, attempts, last_error, error_fp, dead_at)
SELECT * FROM m ON CONFLICT DO NOTHING`,
		`WITH m AS (DELETE FROM `+d.outbox+` WHERE published_at IS NOT NULL
	RETURNING `+messageColumns+`, published_at)
INSERT INTO `+d.kept+` (`+messageColumns+`, published_at)
SELECT * FROM m ON CONFLICT DO NOTHING`,
		`DROP INDEX IF EXISTS `+d.qualify(t+"_pending_idx")+`, `+d.qualify(t+"_dead_idx")+`, `+d.qualify(t+"_dead_fp_idx"),
	)
}

// fingerprintSQL computes sqladapters.FingerprintError of the text
// expression t in SQL: the first 16 bytes of the SHA-256 of its UTF-8
// form.
func fingerprintSQL(t string) string {
	return `substring(sha256(convert_to(` + t + `, 'UTF8')) from 1 for 16)`
}

// inboxVersion is the migration that creates the inbox.
const inboxVersion = 3

// LockMigrations takes a transaction-scoped advisory lock named after the
// outbox table; it is released by the migration transaction's end.
func (d *sqlDialect) LockMigrations() (lock, unlock sqladapters.Query) {
	return sqladapters.Query{
		SQL:  `SELECT pg_advisory_xact_lock(hashtext($1))`,
		Args: []any{"millbox.migrate:" + d.opts.Schema + "." + d.opts.OutboxTable},
	}, sqladapters.Query{}
}

// Schema returns Options.Schema, and the statement selecting the first
// schema of the connection's search_path, which unqualified names resolve
// to, for when it is "".
func (d *sqlDialect) Schema() (string, sqladapters.Query) {
	return d.opts.Schema, sqladapters.Query{SQL: `SELECT current_schema()`}
}

// CreateSchema creates Options.Schema, when set.
func (d *sqlDialect) CreateSchema() []sqladapters.Query {
	if d.opts.Schema == "" {
		return nil
	}
	return []sqladapters.Query{{SQL: `CREATE SCHEMA IF NOT EXISTS ` + quote(d.opts.Schema)}}
}

// ScriptNote says that the statements may run again: each finds its work
// done.
func (d *sqlDialect) ScriptNote() string { return "Statements are idempotent." }

// CreateMigrationsTable creates the schema (when set) and the version table.
//
// It runs under the migration lock, but a session keeps the catalog
// lookups it made in a cache that the grant of an advisory lock does not
// refresh: a migrator whose connection saw the schema missing (it is in
// its search_path, or it was dropped before) would still see it missing
// after the migrator it waited for created it, and fail with a duplicate
// key (SQLSTATE 23505 on pg_namespace) creating it again. Opening
// pg_namespace takes a table lock, which refreshes the cache first, unless
// the transaction opened pg_namespace before; sqladapters.Migrate retries
// in a new transaction for that case.
func (d *sqlDialect) CreateMigrationsTable() []sqladapters.Query {
	var qs []sqladapters.Query
	if d.opts.Schema != "" {
		qs = append(qs, sqladapters.Query{SQL: `SELECT FROM pg_catalog.pg_namespace LIMIT 0`})
		qs = append(qs, d.CreateSchema()...)
	}
	return append(qs, sqladapters.Query{SQL: `CREATE TABLE IF NOT EXISTS ` + d.migrate + ` (
	version    integer PRIMARY KEY,
	name       text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`})
}

// AppliedMigrations selects the applied versions.
func (d *sqlDialect) AppliedMigrations() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT version FROM ` + d.migrate + ` ORDER BY version`}
}

// RecordMigration records an applied version.
func (d *sqlDialect) RecordMigration(version int, name string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `INSERT INTO ` + d.migrate + ` (version, name) VALUES ($1, $2) ON CONFLICT (version) DO NOTHING`,
		Args: []any{version, name},
	}
}
