package sqlite

import "github.com/millbox/millbox/sqladapters"

// OutboxStats counts pending and dead rows and measures the age of the
// oldest pending row by the database clock.
func (d *sqlDialect) OutboxStats() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT
	(SELECT count(*) FROM ` + d.outbox + ` WHERE dead_at IS NULL AND published_at IS NULL),
	(SELECT count(*) FROM ` + d.outbox + ` WHERE dead_at IS NOT NULL),
	coalesce((SELECT CAST((julianday('now') - julianday(created_at)) * 86400000000.0 AS INTEGER) FROM ` + d.outbox + `
		WHERE dead_at IS NULL AND published_at IS NULL ORDER BY id LIMIT 1), 0)`}
}
