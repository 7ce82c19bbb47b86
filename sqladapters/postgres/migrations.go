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
	if d.opts.WithoutInbox {
		ms = slices.DeleteFunc(ms, func(m sqladapters.Migration) bool { return m.Version == inboxVersion })
	}
	return d.layout(ms)
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

// CreateMigrationsTable creates the schema (when set) and the version table.
func (d *sqlDialect) CreateMigrationsTable() []sqladapters.Query {
	var qs []sqladapters.Query
	if d.opts.Schema != "" {
		qs = append(qs, sqladapters.Query{SQL: `CREATE SCHEMA IF NOT EXISTS ` + quote(d.opts.Schema)})
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
