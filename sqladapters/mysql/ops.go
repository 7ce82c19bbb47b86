package mysql

import (
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/ops"
)

// This file holds the SQL of the operations API (package sqladapters/ops).

// statePublished is the state of a forwarded row kept for audit.
const statePublished = "2"

// ageMicros renders the microseconds from the DATETIME expression t to
// now, NULL when t is NULL.
func ageMicros(t string) string {
	return `TIMESTAMPDIFF(MICROSECOND, ` + t + `, ` + now + `)`
}

// utc renders t for comparison with a DATETIME(6) column holding UTC, so
// the driver's loc setting cannot shift it.
func utc(t time.Time) string { return t.UTC().Format(timeLayout) }

// TopicStats counts the outbox rows per topic through the state column.
func (d *sqlDialect) TopicStats() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT topic,
	COUNT(CASE WHEN state = ` + statePending + ` THEN 1 END),
	COUNT(CASE WHEN state = ` + statePending + ` AND attempts > 0 THEN 1 END),
	COUNT(CASE WHEN state = ` + stateDead + ` THEN 1 END),
	COUNT(CASE WHEN state = ` + statePublished + ` THEN 1 END),
	` + ageMicros(`MIN(CASE WHEN state = `+statePending+` THEN created_at END)`) + `
FROM ` + d.outbox + ` GROUP BY topic ORDER BY topic`}
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

// deadWhere renders the conditions of w on dead rows aliased o, with its
// arguments.
func deadWhere(w ops.Where) (string, []any) {
	var b strings.Builder
	var args []any
	b.WriteString(`o.state = ` + stateDead)
	add := func(cond string, v any) {
		b.WriteString(` AND ` + cond)
		args = append(args, v)
	}
	if len(w.IDs) > 0 {
		b.WriteString(` AND ` + idIn("o.id", w.IDs))
	}
	if w.Topic != "" {
		add(`o.topic = ?`, w.Topic)
	}
	if w.Key != "" {
		add("o.`key` = ?", w.Key)
	}
	if w.ErrorContains != "" {
		add(`LOCATE(?, o.last_error) > 0`, w.ErrorContains)
	}
	if !w.DeadBefore.IsZero() {
		add(`o.dead_at < ?`, utc(w.DeadBefore))
	}
	if !w.DeadAfter.IsZero() {
		add(`o.dead_at >= ?`, utc(w.DeadAfter))
	}
	return b.String(), args
}

// SelectDeadLetters pages through the dead rows matching w.
func (d *sqlDialect) SelectDeadLetters(w ops.Where, afterID int64, limit int) sqladapters.Query {
	where, args := deadWhere(w)
	return sqladapters.Query{
		SQL: `SELECT ` + rowColumns + `, COALESCE(o.last_error, ''), o.created_at, o.dead_at FROM ` + d.outbox + ` o
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
	return sqladapters.Query{SQL: `SELECT COUNT(*) FROM ` + d.outbox + ` o WHERE ` + where, Args: args}
}

// GroupDeadLetters groups the dead rows matching w by last error.
func (d *sqlDialect) GroupDeadLetters(w ops.Where, limit int) sqladapters.Query {
	where, args := deadWhere(w)
	return sqladapters.Query{
		SQL: `SELECT COALESCE(o.last_error, '') AS e, COUNT(*), MIN(o.id), ` + ageMicros(`MIN(o.dead_at)`) + `, ` + ageMicros(`MAX(o.dead_at)`) + `
FROM ` + d.outbox + ` o WHERE ` + where + `
GROUP BY e ORDER BY COUNT(*) DESC, MIN(o.id) LIMIT ?`,
		Args: append(args, limit),
	}
}

// DeleteDeadLetters deletes the given rows that are still dead.
func (d *sqlDialect) DeleteDeadLetters(ids []int64) sqladapters.Query {
	return sqladapters.Query{SQL: `DELETE FROM ` + d.outbox + ` WHERE state = ` + stateDead + ` AND ` + idIn("id", ids)}
}

// CountForwardedBefore counts kept rows published before t.
func (d *sqlDialect) CountForwardedBefore(t time.Time) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT COUNT(*) FROM ` + d.outbox + ` WHERE state = ` + statePublished + ` AND published_at < ?`,
		Args: []any{utc(t)},
	}
}

// SelectForwardedIDs pages through kept rows published before t, through
// state_idx.
func (d *sqlDialect) SelectForwardedIDs(t time.Time, afterID int64, limit int) sqladapters.Query {
	return sqladapters.Query{
		SQL: `SELECT id FROM ` + d.outbox + ` FORCE INDEX (state_idx)
WHERE state = ` + statePublished + ` AND id > ? AND published_at < ? ORDER BY id LIMIT ?`,
		Args: []any{afterID, utc(t), limit},
	}
}

// CountInboxBefore counts the inbox records received before t.
func (d *sqlDialect) CountInboxBefore(t time.Time) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT COUNT(*) FROM ` + d.inbox + ` WHERE received_at < ?`,
		Args: []any{utc(t)},
	}
}
