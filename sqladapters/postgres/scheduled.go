package postgres

import (
	"strconv"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
)

// scheduledSuffix names the table of messages waiting for their due time.
const scheduledSuffix = "_scheduled"

// scheduledTable returns the statements of version 7: the table of
// scheduled messages and its index on the due time. It is a plain table in
// both layouts: its rows are few next to the outbox's traffic and leave
// it by the delete of the move.
func (d *sqlDialect) scheduledTable() []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + d.scheduled + ` (
	id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	topic      text        NOT NULL,
	uuid       text        NOT NULL,
	payload    bytea       NOT NULL,
	metadata   jsonb       NOT NULL DEFAULT '{}',
	key        text,
	key_hash   integer     NOT NULL DEFAULT 0,
	created_at timestamptz NOT NULL DEFAULT now(),
	due_at     timestamptz NOT NULL
)`,
		// The move and NextDue read the earliest rows through it.
		`CREATE INDEX IF NOT EXISTS ` + quote(d.opts.OutboxTable+"_sched_idx") + ` ON ` + d.scheduled + ` (due_at, id)`,
	}
}

// scheduledTypes are the casts of one scheduled row's parameters, in
// column order.
var scheduledTypes = [...]string{"::text", "::text", "::bytea", "::jsonb", "::text", "::integer", "::timestamptz"}

// InsertScheduled inserts msgs into the scheduled table with one
// multi-row INSERT per 5,000 messages, or per insertBudget bytes when
// they are large; identity values follow the VALUES order.
func (d *sqlDialect) InsertScheduled(msgs []sqladapters.OutboxMessage) []sqladapters.Query {
	var qs []sqladapters.Query
	for start := 0; start < len(msgs); {
		end, size := start, 0
		for end < len(msgs) && end-start < rowsPerInsert {
			m := msgs[end]
			n := 2 * (len(m.Topic) + len(m.UUID) + len(m.Payload) + len(m.Metadata) + len(m.Key))
			if end > start && size+n > insertBudget {
				break
			}
			size += n
			end++
		}
		qs = append(qs, d.scheduledChunk(msgs[start:end]))
		start = end
	}
	return qs
}

func (d *sqlDialect) scheduledChunk(msgs []sqladapters.OutboxMessage) sqladapters.Query {
	var b strings.Builder
	args := make([]any, 0, len(msgs)*len(scheduledTypes))
	b.WriteString("INSERT INTO ")
	b.WriteString(d.scheduled)
	b.WriteString(" (topic, uuid, payload, metadata, key, key_hash, due_at) ")
	if d.opts.FlushStats {
		b.WriteString("SELECT * FROM (")
	}
	b.WriteString("VALUES ")
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		n := len(args)
		for j, typ := range scheduledTypes {
			if j == 0 {
				b.WriteByte('(')
			} else {
				b.WriteByte(',')
			}
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n + j + 1))
			b.WriteString(typ)
		}
		b.WriteByte(')')
		var key any
		if m.Key != "" {
			key = m.Key
		}
		args = append(args, m.Topic, m.UUID, m.Payload, string(m.Metadata), key, m.KeyHash, m.DueAt.UTC())
	}
	if d.opts.FlushStats {
		// The VALUES columns carry their types, so the subquery keeps
		// them; identity values still follow the VALUES order.
		b.WriteString(") v WHERE " + flushStats)
	}
	return sqladapters.Query{SQL: b.String(), Args: args}
}

// MoveDue moves the due rows in one statement, after a
// transaction-scoped advisory lock named after the outbox that makes
// concurrent moves take turns. Without it, two moves would each lock a
// share of one key's due rows (SKIP LOCKED lets the second pass the
// first's) and draw their outbox ids and commit in any order, so the
// forwarder would send the key's rows out of due order. Waiting for the
// lock rather than trying it keeps a mover that finds it taken from
// looking again in a loop: the wait lasts one batch, and the statement
// after it sees what the move it waited for committed.
//
// The DELETE locks up to limit of the earliest due rows, skipping any that
// a mover of an earlier version holds, and the INSERT writes them into the
// outbox by due time and id, so that outbox ids follow that order. The
// DELETE hands a row to the INSERT only once it has deleted it, which
// gives the transaction its id before the identity default draws the
// first row id, as PendingHorizon needs (the outbox insert takes it with a
// filter, see InsertOutbox); a move that finds nothing due takes no
// transaction id and writes nothing. The rows get a new created_at: their
// age counts from when they became due, and on a partitioned outbox they
// land in the current partition.
func (d *sqlDialect) MoveDue(now time.Time, limit int) sqlstore.DueMove {
	move := sqladapters.Query{
		SQL: `WITH due AS (
	DELETE FROM ` + d.scheduled + ` WHERE id IN (
		SELECT id FROM ` + d.scheduled + ` WHERE due_at <= $1
		ORDER BY due_at, id LIMIT $2 FOR UPDATE SKIP LOCKED)
	RETURNING id, topic, uuid, payload, metadata, key, key_hash, due_at)
INSERT INTO ` + d.outbox + ` (topic, uuid, payload, metadata, key, key_hash)
SELECT topic, uuid, payload, metadata, key, key_hash FROM due ORDER BY due_at, id`,
		Args: []any{now.UTC(), limit},
	}
	return sqlstore.DueMove{
		Lock: sqladapters.Query{
			SQL:  `SELECT pg_advisory_xact_lock(hashtext($1))`,
			Args: []any{"millbox.move:" + d.opts.Schema + "." + d.opts.OutboxTable},
		},
		Move: func([]int64) []sqladapters.Query { return []sqladapters.Query{move} },
	}
}

// RetryMove returns false: moves wait for each other at the lock and never
// deadlock.
func (d *sqlDialect) RetryMove(error) bool { return false }

// nextDueMicros is the earliest due time of the scheduled table in
// microseconds since the Unix epoch, NULL when it is empty; it reads one
// entry of the due-time index.
func (d *sqlDialect) nextDueMicros() string {
	return `(SELECT (extract(epoch FROM due_at) * 1000000)::bigint FROM ` + d.scheduled + ` ORDER BY due_at, id LIMIT 1)`
}

// NextDue selects the earliest due time.
func (d *sqlDialect) NextDue() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT ` + d.nextDueMicros()}
}
