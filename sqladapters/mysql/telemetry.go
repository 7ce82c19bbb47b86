package mysql

import "github.com/millbox/millbox/sqladapters"

// OutboxStats counts pending and dead rows through state_idx and measures
// the age of the oldest pending row by the database clock.
func (d *sqlDialect) OutboxStats() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT
	(SELECT count(*) FROM ` + d.outbox + ` WHERE state = ` + statePending + `),
	(SELECT count(*) FROM ` + d.outbox + ` WHERE state = ` + stateDead + `),
	COALESCE((SELECT TIMESTAMPDIFF(MICROSECOND, created_at, ` + now + `) FROM ` + d.outbox + ` FORCE INDEX (state_idx)
		WHERE state = ` + statePending + ` ORDER BY state, id LIMIT 1), 0)`}
}
