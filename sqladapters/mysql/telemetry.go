package mysql

import "github.com/millbox/millbox/sqladapters"

// OutboxStats counts the pending rows (the whole outbox), the dead
// letters and the keys they hold (through hold_idx), and measures how long the oldest pending row has waited by the
// database clock. The row with the lowest id stands in for the oldest; as
// a requeued row waits from its requeue, the lowest row never requeued is
// measured too, so that an old row behind a fresh requeue still shows.
func (d *sqlDialect) OutboxStats() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT
	(SELECT COUNT(*) FROM ` + d.outbox + `),
	(SELECT COUNT(*) FROM ` + d.dead + `),
	GREATEST(
		COALESCE((SELECT ` + ageMicros(waitingSince) + ` FROM ` + d.outbox + ` o ORDER BY o.id LIMIT 1), 0),
		COALESCE((SELECT ` + ageMicros(`created_at`) + ` FROM ` + d.outbox + ` WHERE requeued_at IS NULL ORDER BY id LIMIT 1), 0)),
	(` + d.CountHeldKeys().SQL + `),
	(SELECT COUNT(*) FROM ` + d.scheduled + `),
	` + d.nextDueMicros()}
}

// CountHeldKeys counts the keys held by dead letters, through hold_idx.
func (d *sqlDialect) CountHeldKeys() sqladapters.Query {
	return sqladapters.Query{SQL: "SELECT COUNT(DISTINCT `key`) FROM " + d.dead + ` FORCE INDEX (hold_idx) WHERE holds = 1`}
}
