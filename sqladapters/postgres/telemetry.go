package postgres

import "github.com/millbox/millbox/sqladapters"

// OutboxStats counts pending and dead rows and measures the age of the
// oldest pending row by the database clock, so that the result does not
// depend on the caller's clock.
func (d *sqlDialect) OutboxStats() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT
	(SELECT count(*) FROM ` + d.outbox + ` WHERE dead_at IS NULL AND published_at IS NULL),
	(SELECT count(*) FROM ` + d.outbox + ` WHERE dead_at IS NOT NULL),
	coalesce((SELECT (extract(epoch FROM now() - created_at) * 1000000)::bigint FROM ` + d.outbox + `
		WHERE dead_at IS NULL AND published_at IS NULL ORDER BY id LIMIT 1), 0)`}
}
