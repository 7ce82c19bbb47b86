package postgres

import (
	"strconv"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/ops"
)

// This file holds the SQL of the operations API (package sqladapters/ops).

// ageMicros renders the microseconds from the timestamp expression t to
// now, NULL when t is NULL.
func ageMicros(t string) string {
	return `(extract(epoch from now() - ` + t + `) * 1000000)::bigint`
}

// TopicStats counts the outbox rows per topic.
func (d *sqlDialect) TopicStats() sqladapters.Query {
	const pending = `dead_at IS NULL AND published_at IS NULL`
	return sqladapters.Query{SQL: `SELECT topic,
	count(*) FILTER (WHERE ` + pending + `),
	count(*) FILTER (WHERE ` + pending + ` AND attempts > 0),
	count(*) FILTER (WHERE dead_at IS NOT NULL AND published_at IS NULL),
	count(*) FILTER (WHERE published_at IS NOT NULL),
	` + ageMicros(`min(created_at) FILTER (WHERE `+pending+`)`) + `
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
	CASE WHEN expires_at > now() THEN owner END,
	CASE WHEN expires_at > now() AND owner IS NOT NULL THEN (extract(epoch from expires_at - now()) * 1000000)::bigint END
FROM ` + d.leases + ` ORDER BY partition`}
}

// deadWhere renders the conditions of w on dead rows aliased o, numbering
// parameters after args.
func deadWhere(w ops.Where, args []any) (string, []any) {
	var b strings.Builder
	b.WriteString(`o.dead_at IS NOT NULL AND o.published_at IS NULL`)
	add := func(cond string, v any) {
		args = append(args, v)
		b.WriteString(` AND ` + strings.Replace(cond, "$?", "$"+strconv.Itoa(len(args)), 1))
	}
	if len(w.IDs) > 0 {
		add(`o.id = ANY($?::bigint[])`, int64Array(w.IDs))
	}
	if w.Topic != "" {
		add(`o.topic = $?`, w.Topic)
	}
	if w.Key != "" {
		add(`o.key = $?`, w.Key)
	}
	if w.ErrorContains != "" {
		add(`strpos(o.last_error, $?::text) > 0`, w.ErrorContains)
	}
	if !w.DeadBefore.IsZero() {
		add(`o.dead_at < $?::timestamptz`, w.DeadBefore)
	}
	if !w.DeadAfter.IsZero() {
		add(`o.dead_at >= $?::timestamptz`, w.DeadAfter)
	}
	return b.String(), args
}

// SelectDeadLetters pages through the dead rows matching w.
func (d *sqlDialect) SelectDeadLetters(w ops.Where, afterID int64, limit int) sqladapters.Query {
	where, args := deadWhere(w, []any{afterID, limit})
	return sqladapters.Query{
		SQL: `SELECT ` + rowColumns + `, coalesce(o.last_error, ''), o.created_at, o.dead_at FROM ` + d.outbox + ` o
WHERE ` + where + ` AND o.id > $1 ORDER BY o.id LIMIT $2`,
		Args: args,
	}
}

// SelectDeadLetterIDs pages through the ids of the dead rows matching w.
func (d *sqlDialect) SelectDeadLetterIDs(w ops.Where, afterID int64, limit int) sqladapters.Query {
	where, args := deadWhere(w, []any{afterID, limit})
	return sqladapters.Query{
		SQL:  `SELECT o.id FROM ` + d.outbox + ` o WHERE ` + where + ` AND o.id > $1 ORDER BY o.id LIMIT $2`,
		Args: args,
	}
}

// CountDeadLetters counts the dead rows matching w.
func (d *sqlDialect) CountDeadLetters(w ops.Where) sqladapters.Query {
	where, args := deadWhere(w, nil)
	return sqladapters.Query{SQL: `SELECT count(*) FROM ` + d.outbox + ` o WHERE ` + where, Args: args}
}

// GroupDeadLetters groups the dead rows matching w by last error.
func (d *sqlDialect) GroupDeadLetters(w ops.Where, limit int) sqladapters.Query {
	where, args := deadWhere(w, []any{limit})
	return sqladapters.Query{
		SQL: `SELECT coalesce(o.last_error, ''), count(*), min(o.id), ` + ageMicros(`min(o.dead_at)`) + `, ` + ageMicros(`max(o.dead_at)`) + `
FROM ` + d.outbox + ` o WHERE ` + where + `
GROUP BY coalesce(o.last_error, '') ORDER BY count(*) DESC, min(o.id) LIMIT $1`,
		Args: args,
	}
}

// DeleteDeadLetters deletes the given rows that are still dead.
func (d *sqlDialect) DeleteDeadLetters(ids []int64) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `DELETE FROM ` + d.outbox + ` WHERE dead_at IS NOT NULL AND published_at IS NULL AND id = ANY($1::bigint[])`,
		Args: []any{int64Array(ids)},
	}
}

// CountForwardedBefore counts kept rows published before t.
func (d *sqlDialect) CountForwardedBefore(t time.Time) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT count(*) FROM ` + d.outbox + ` WHERE published_at < $1::timestamptz`,
		Args: []any{t},
	}
}

// SelectForwardedIDs pages through kept rows published before t, along the
// primary key.
func (d *sqlDialect) SelectForwardedIDs(t time.Time, afterID int64, limit int) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT id FROM ` + d.outbox + ` WHERE id > $1 AND published_at < $2::timestamptz ORDER BY id LIMIT $3`,
		Args: []any{afterID, t, limit},
	}
}

// CountInboxBefore counts the inbox records received before t.
func (d *sqlDialect) CountInboxBefore(t time.Time) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT count(*) FROM ` + d.inbox + ` WHERE received_at < $1::timestamptz`,
		Args: []any{t},
	}
}
