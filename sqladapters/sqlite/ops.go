package sqlite

import (
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/ops"
)

// This file holds the SQL of the operations API (package sqladapters/ops).

// ageMicros renders the microseconds from the time expression t to now,
// NULL when t is NULL. julianday reads TimeLayout, trailing Z included.
func ageMicros(t string) string {
	return `CAST(round((julianday('now') - julianday(` + t + `)) * 86400000000.0) AS INTEGER)`
}

// TopicStats counts the outbox rows per topic.
func (d *sqlDialect) TopicStats() sqladapters.Query {
	const pending = `dead_at IS NULL AND published_at IS NULL`
	return sqladapters.Query{SQL: `SELECT topic,
	count(CASE WHEN ` + pending + ` THEN 1 END),
	count(CASE WHEN ` + pending + ` AND attempts > 0 THEN 1 END),
	count(CASE WHEN dead_at IS NOT NULL AND published_at IS NULL THEN 1 END),
	count(CASE WHEN published_at IS NOT NULL THEN 1 END),
	` + ageMicros(`min(CASE WHEN `+pending+` THEN created_at END)`) + `
FROM ` + d.outbox + ` GROUP BY topic ORDER BY topic`}
}

// InboxStats counts the inbox records per consumer.
func (d *sqlDialect) InboxStats() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT consumer, count(*), ` + ageMicros(`min(received_at)`) + `
FROM ` + d.inbox + ` GROUP BY consumer ORDER BY consumer`}
}

// PartitionLeases lists the partitions with their live owners.
func (d *sqlDialect) PartitionLeases() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT partition,
	CASE WHEN expires_at > ` + now + ` THEN owner END,
	CASE WHEN expires_at > ` + now + ` AND owner IS NOT NULL
		THEN CAST(round((julianday(expires_at) - julianday('now')) * 86400000000.0) AS INTEGER) END
FROM ` + d.leases + ` ORDER BY partition`}
}

// deadWhere renders the conditions of w on dead rows aliased o, with its
// arguments.
func deadWhere(w ops.Where) (string, []any) {
	var b strings.Builder
	var args []any
	b.WriteString(`o.dead_at IS NOT NULL AND o.published_at IS NULL`)
	add := func(cond string, v any) {
		b.WriteString(` AND ` + cond)
		args = append(args, v)
	}
	if len(w.IDs) > 0 {
		add(`o.id IN (SELECT value FROM json_each(?))`, idList(w.IDs))
	}
	if w.Topic != "" {
		add(`o.topic = ?`, w.Topic)
	}
	if w.Key != "" {
		add(`o.key = ?`, w.Key)
	}
	if w.ErrorContains != "" {
		add(`instr(o.last_error, ?) > 0`, w.ErrorContains)
	}
	if !w.DeadBefore.IsZero() {
		add(`o.dead_at < ?`, formatTime(w.DeadBefore))
	}
	if !w.DeadAfter.IsZero() {
		add(`o.dead_at >= ?`, formatTime(w.DeadAfter))
	}
	return b.String(), args
}

// SelectDeadLetters pages through the dead rows matching w. created_at and
// dead_at are bare columns, so drivers see their declared TIMESTAMP type.
func (d *sqlDialect) SelectDeadLetters(w ops.Where, afterID int64, limit int) sqladapters.Query {
	where, args := deadWhere(w)
	return sqladapters.Query{
		SQL: `SELECT ` + rowColumns + `, coalesce(o.last_error, ''), o.created_at, o.dead_at FROM ` + d.outbox + ` o
WHERE ` + where + ` AND o.id > ? ORDER BY o.id LIMIT ?`,
		Args: append(args, afterID, limit),
	}
}

// SelectDeadLetterIDs pages through the ids of the dead rows matching w.
func (d *sqlDialect) SelectDeadLetterIDs(w ops.Where, afterID int64, limit int) sqladapters.Query {
	where, args := deadWhere(w)
	return sqladapters.Query{
		SQL:  `SELECT o.id FROM ` + d.outbox + ` o WHERE ` + where + ` AND o.id > ? ORDER BY o.id LIMIT ?`,
		Args: append(args, afterID, limit),
	}
}

// CountDeadLetters counts the dead rows matching w.
func (d *sqlDialect) CountDeadLetters(w ops.Where) sqladapters.Query {
	where, args := deadWhere(w)
	return sqladapters.Query{SQL: `SELECT count(*) FROM ` + d.outbox + ` o WHERE ` + where, Args: args}
}

// GroupDeadLetters groups the dead rows matching w by last error.
func (d *sqlDialect) GroupDeadLetters(w ops.Where, limit int) sqladapters.Query {
	where, args := deadWhere(w)
	return sqladapters.Query{
		SQL: `SELECT coalesce(o.last_error, '') AS e, count(*), min(o.id), ` + ageMicros(`min(o.dead_at)`) + `, ` + ageMicros(`max(o.dead_at)`) + `
FROM ` + d.outbox + ` o WHERE ` + where + `
GROUP BY e ORDER BY count(*) DESC, min(o.id) LIMIT ?`,
		Args: append(args, limit),
	}
}

// DeleteDeadLetters deletes the given rows that are still dead.
func (d *sqlDialect) DeleteDeadLetters(ids []int64) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `DELETE FROM ` + d.outbox + ` WHERE dead_at IS NOT NULL AND published_at IS NULL AND id IN (SELECT value FROM json_each(?))`,
		Args: []any{idList(ids)},
	}
}

// CountForwardedBefore counts kept rows published before t.
func (d *sqlDialect) CountForwardedBefore(t time.Time) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT count(*) FROM ` + d.outbox + ` WHERE published_at < ?`,
		Args: []any{formatTime(t)},
	}
}

// SelectForwardedIDs pages through kept rows published before t, along the
// rowid.
func (d *sqlDialect) SelectForwardedIDs(t time.Time, afterID int64, limit int) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT id FROM ` + d.outbox + ` WHERE id > ? AND published_at < ? ORDER BY id LIMIT ?`,
		Args: []any{afterID, formatTime(t), limit},
	}
}

// CountInboxBefore counts the inbox records received before t.
func (d *sqlDialect) CountInboxBefore(t time.Time) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT count(*) FROM ` + d.inbox + ` WHERE received_at < ?`,
		Args: []any{formatTime(t)},
	}
}
