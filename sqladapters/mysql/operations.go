package mysql

import (
	"strconv"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// This file holds the SQL of the operations verbs of the store contract,
// which sqladapters/ops, the admin page and the millbox command run.

// ageMicros renders the microseconds from the DATETIME expression t to
// now, NULL when t is NULL.
func ageMicros(t string) string {
	return `TIMESTAMPDIFF(MICROSECOND, ` + t + `, ` + now + `)`
}

// waitingSince is when a pending row of the outbox aliased o started to
// wait: its requeue, or else its creation.
const waitingSince = `COALESCE(o.requeued_at, o.created_at)`

// utc renders t for comparison with a DATETIME(6) column holding UTC, so
// the driver's loc setting cannot shift it.
func utc(t time.Time) string { return t.UTC().Format(timeLayout) }

// TopicStats counts the rows per topic of the outbox, the dead letters,
// the kept rows and the scheduled messages.
func (d *sqlDialect) TopicStats() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT topic, SUM(pending), SUM(retrying), SUM(dead), SUM(kept), ` + ageMicros(`MIN(waiting)`) + `,
	SUM(scheduled), TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', MIN(due))
FROM (
	SELECT topic, COUNT(*) AS pending, COUNT(CASE WHEN attempts > 0 THEN 1 END) AS retrying, 0 AS dead, 0 AS kept, MIN(` + waitingSince + `) AS waiting, 0 AS scheduled, NULL AS due
	FROM ` + d.outbox + ` o GROUP BY topic
	UNION ALL SELECT topic, 0, 0, COUNT(*), 0, NULL, 0, NULL FROM ` + d.dead + ` GROUP BY topic
	UNION ALL SELECT topic, 0, 0, 0, COUNT(*), NULL, 0, NULL FROM ` + d.kept + ` GROUP BY topic
	UNION ALL SELECT topic, 0, 0, 0, 0, NULL, COUNT(*), MIN(due_at) FROM ` + d.scheduled + ` GROUP BY topic
) t GROUP BY topic ORDER BY topic`}
}

// InboxStats counts the inbox records per consumer.
func (d *sqlDialect) InboxStats() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT consumer, COUNT(*), ` + ageMicros(`MIN(received_at)`) + `
FROM ` + d.inbox + ` GROUP BY consumer ORDER BY consumer`}
}

// PartitionLeases lists the partitions with their live owners.
func (d *sqlDialect) PartitionLeases() sqladapters.Query {
	return sqladapters.Query{SQL: "SELECT `partition`,\n" +
		`	CASE WHEN expires_at > ` + now + ` THEN owner END,
	CASE WHEN expires_at > ` + now + ` AND owner IS NOT NULL THEN TIMESTAMPDIFF(MICROSECOND, ` + now + `, expires_at) END
FROM ` + d.leases + " ORDER BY `partition`"}
}

// deadWhere renders the conditions of f on dead letters aliased o, with
// its arguments. Ages count back from the database's clock.
func deadWhere(f sqladapters.DeadLetterFilter) (string, []any) {
	var b strings.Builder
	var args []any
	b.WriteString(`TRUE`)
	add := func(cond string, v any) {
		b.WriteString(` AND ` + cond)
		args = append(args, v)
	}
	if len(f.IDs) > 0 {
		b.WriteString(` AND ` + idIn("o.id", f.IDs))
	}
	if f.Topic != "" {
		add(`o.topic = ?`, f.Topic)
	}
	if f.Key != "" {
		add("o.`key` = ?", f.Key)
	}
	if f.ErrorContains != "" {
		add(`LOCATE(?, o.last_error) > 0`, f.ErrorContains)
	}
	switch {
	case f.Fingerprint == nil:
	case f.Fingerprint.IsZero():
		b.WriteString(` AND o.error_fp IS NULL`)
	default:
		add(`o.error_fp = ?`, f.Fingerprint[:])
	}
	if f.OlderThan > 0 {
		add(`o.dead_at < `+now+` - INTERVAL ? MICROSECOND`, micros(f.OlderThan))
	}
	if f.NewerThan > 0 {
		add(`o.dead_at >= `+now+` - INTERVAL ? MICROSECOND`, micros(f.NewerThan))
	}
	return b.String(), args
}

// deadFrom is the dead letters' table aliased o as the statements of f
// read it: one error group through fp_idx, which the optimizer would
// otherwise pass over for the primary key, walking every dead letter in id
// order to find a sparse group's.
func (d *sqlDialect) deadFrom(f sqladapters.DeadLetterFilter) string {
	if f.Fingerprint != nil {
		return d.dead + ` o FORCE INDEX (fp_idx)`
	}
	return d.dead + ` o`
}

// deadColumns are the columns of a dead letter without its payload and
// metadata, and payloadColumns those two.
const (
	deadColumns    = "o.id, o.topic, o.uuid, o.`key`, o.attempts, COALESCE(o.last_error, ''), o.error_fp, o.created_at, o.dead_at, o.holds"
	payloadColumns = `, o.payload, o.metadata`
)

// SelectDeadLetters pages through the dead letters q selects.
func (d *sqlDialect) SelectDeadLetters(q sqladapters.DeadLetterQuery) sqladapters.Query {
	where, args := deadWhere(q.Filter)
	cols := deadColumns
	if q.ErrorChars > 0 {
		cols = strings.Replace(cols, `COALESCE(o.last_error, '')`, `LEFT(COALESCE(o.last_error, ''), `+strconv.Itoa(q.ErrorChars)+`)`, 1)
	}
	if q.Payloads {
		cols += payloadColumns
	}
	return sqladapters.Query{
		SQL:  `SELECT ` + cols + ` FROM ` + d.deadFrom(q.Filter) + ` WHERE ` + where + ` AND o.id > ? ORDER BY o.id LIMIT ?`,
		Args: append(args, q.AfterID, q.Limit),
	}
}

// SelectDeadLetterIDs pages through the ids of the dead letters f selects.
func (d *sqlDialect) SelectDeadLetterIDs(f sqladapters.DeadLetterFilter, afterID int64, limit int) sqladapters.Query {
	where, args := deadWhere(f)
	return sqladapters.Query{
		SQL:  `SELECT o.id FROM ` + d.deadFrom(f) + ` WHERE ` + where + ` AND o.id > ? ORDER BY o.id LIMIT ?`,
		Args: append(args, afterID, limit),
	}
}

// SelectHeldKeys lists the keys held by dead letters, through hold_idx,
// and counts the outbox rows waiting behind each in one join with the
// outbox, which has no index on keys.
func (d *sqlDialect) SelectHeldKeys(limit int) sqladapters.Query {
	return sqladapters.Query{
		SQL: "SELECT h.`key`, h.id, COUNT(o.id)\nFROM (SELECT `key`, key_hash, MIN(id) AS id FROM " + d.dead + ` FORCE INDEX (hold_idx) WHERE holds = 1
	GROUP BY ` + "`key`" + `, key_hash ORDER BY MIN(id) LIMIT ?) h
LEFT JOIN ` + d.outbox + ` o ON o.key_hash = h.key_hash AND o.` + "`key` = h.`key`" + ` AND o.id > h.id
GROUP BY h.` + "`key`" + `, h.id ORDER BY h.id`,
		Args: []any{limit},
	}
}

// CountDeadLetters counts the dead letters f selects.
func (d *sqlDialect) CountDeadLetters(f sqladapters.DeadLetterFilter) sqladapters.Query {
	where, args := deadWhere(f)
	return sqladapters.Query{SQL: `SELECT COUNT(*) FROM ` + d.deadFrom(f) + ` WHERE ` + where, Args: args}
}

// GroupDeadLetters groups the dead letters f selects by error fingerprint,
// through fp_idx, and reads the error text of each group's lowest id
// only: the texts of a group are equal, and may be large.
func (d *sqlDialect) GroupDeadLetters(f sqladapters.DeadLetterFilter, limit int) sqladapters.Query {
	where, args := deadWhere(f)
	return sqladapters.Query{
		SQL: `SELECT g.fp, LEFT(COALESCE((SELECT s.last_error FROM ` + d.dead + ` s WHERE s.id = g.first), ''), ` + strconv.Itoa(sqladapters.GroupErrorChars) + `),
	g.n, g.first, ` + ageMicros(`g.first_dead`) + `, ` + ageMicros(`g.last_dead`) + `
FROM (SELECT o.error_fp AS fp, COUNT(*) AS n, MIN(o.id) AS first, MIN(o.dead_at) AS first_dead, MAX(o.dead_at) AS last_dead
	FROM ` + d.dead + ` o WHERE ` + where + `
	GROUP BY o.error_fp ORDER BY COUNT(*) DESC, MIN(o.id) LIMIT ?) g
ORDER BY g.n DESC, g.first`,
		Args: append(args, limit),
	}
}

// DeleteDeadLetters deletes the given dead letters.
func (d *sqlDialect) DeleteDeadLetters(ids []int64) sqladapters.Query {
	return sqladapters.Query{SQL: `DELETE FROM ` + d.dead + ` WHERE ` + idIn("id", ids)}
}

// CountForwardedBefore counts kept rows published before t.
func (d *sqlDialect) CountForwardedBefore(t time.Time) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT COUNT(*) FROM ` + d.kept + ` WHERE published_at < ?`,
		Args: []any{utc(t)},
	}
}

// SelectForwardedIDs pages through kept rows published before t, along the
// primary key.
func (d *sqlDialect) SelectForwardedIDs(t time.Time, afterID int64, limit int) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT id FROM ` + d.kept + ` WHERE id > ? AND published_at < ? ORDER BY id LIMIT ?`,
		Args: []any{afterID, utc(t), limit},
	}
}

// DeleteForwarded deletes kept rows.
func (d *sqlDialect) DeleteForwarded(ids []int64) sqladapters.Query {
	return sqladapters.Query{SQL: `DELETE FROM ` + d.kept + ` WHERE ` + idIn("id", ids)}
}

// CountInboxBefore counts the inbox records received before t.
func (d *sqlDialect) CountInboxBefore(t time.Time) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT COUNT(*) FROM ` + d.inbox + ` WHERE received_at < ?`,
		Args: []any{utc(t)},
	}
}
