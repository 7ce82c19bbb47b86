package sqlite

import "github.com/millbox/millbox/sqladapters"

// OutboxStats counts the pending rows (the whole outbox), the dead
// letters and the keys they hold (through the hold index), and measures how long the oldest pending row has waited by the
// database clock. The row with the lowest id stands in for the oldest; as
// a requeued row waits from its requeue, the lowest row never requeued is
// measured too, so that an old row behind a fresh requeue still shows.
func (d *sqlDialect) OutboxStats() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT
	(SELECT count(*) FROM ` + d.outbox + `),
	(SELECT count(*) FROM ` + d.dead + `),
	max(
		coalesce((SELECT ` + ageMicros(waitingSince) + ` FROM ` + d.outbox + ` o ORDER BY id LIMIT 1), 0),
		coalesce((SELECT ` + ageMicros(`created_at`) + ` FROM ` + d.outbox + ` WHERE requeued_at IS NULL ORDER BY id LIMIT 1), 0)),
	(` + d.CountHeldKeys().SQL + `),
	(SELECT count(*) FROM ` + d.scheduled + `),
	` + d.nextDueMicros()}
}

// CountHeldKeys counts the keys held by dead letters, through the hold
// index.
func (d *sqlDialect) CountHeldKeys() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT count(DISTINCT key) FROM ` + d.dead + ` WHERE holds = 1`}
}
