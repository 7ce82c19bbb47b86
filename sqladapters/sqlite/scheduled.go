package sqlite

import (
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
)

// scheduledTable returns the statements of version 7: the table of
// scheduled messages and its index on the due time. due_at holds
// microseconds since the Unix epoch, which compare and convert exactly.
func (d *sqlDialect) scheduledTable() []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + d.scheduled + ` (
	id          INTEGER   PRIMARY KEY AUTOINCREMENT,` + messageColumnsDDL + `
	due_at      INTEGER   NOT NULL
)`,
		`CREATE INDEX IF NOT EXISTS ` + quote(d.opts.OutboxTable+"_sched_idx") + ` ON ` + d.scheduled + ` (due_at, id)`,
	}
}

// InsertScheduled inserts msgs into the scheduled table with one
// multi-row INSERT per 5,000 messages; SQLite assigns ids in VALUES order.
func (d *sqlDialect) InsertScheduled(msgs []sqladapters.OutboxMessage) []sqladapters.Query {
	var qs []sqladapters.Query
	for start := 0; start < len(msgs); start += rowsPerInsert {
		end := min(start+rowsPerInsert, len(msgs))
		qs = append(qs, d.scheduledChunk(msgs[start:end]))
	}
	return qs
}

func (d *sqlDialect) scheduledChunk(msgs []sqladapters.OutboxMessage) sqladapters.Query {
	const tuple = `(?,?,?,?,?,?,` + now + `,?)`
	var b strings.Builder
	b.Grow(100 + len(msgs)*(len(tuple)+1))
	b.WriteString("INSERT INTO ")
	b.WriteString(d.scheduled)
	b.WriteString(" (topic, uuid, payload, metadata, key, key_hash, created_at, due_at) VALUES ")
	args := make([]any, 0, len(msgs)*7)
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(tuple)
		var key any
		if m.Key != "" {
			key = m.Key
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		metadata := string(m.Metadata)
		if metadata == "" {
			metadata = "{}"
		}
		args = append(args, m.Topic, m.UUID, payload, metadata, key, m.KeyHash, m.DueAt.UnixMicro())
	}
	return sqladapters.Query{SQL: b.String(), Args: args}
}

// MoveDue copies the earliest due rows into the outbox by due time and id
// and then deletes them. SQLite runs one writer at a time, and the
// INSERT makes this transaction the writer, so the DELETE finds the same
// rows, and moves take turns without a lock of their own. The rows get a
// new created_at: their age counts from when they became due.
func (d *sqlDialect) MoveDue(now time.Time, limit int) sqlstore.DueMove {
	due := `SELECT id FROM ` + d.scheduled + ` WHERE due_at <= ? ORDER BY due_at, id LIMIT ?`
	args := []any{now.UnixMicro(), limit}
	qs := []sqladapters.Query{{
		SQL: `INSERT INTO ` + d.outbox + ` (topic, uuid, payload, metadata, key, key_hash)
SELECT topic, uuid, payload, metadata, key, key_hash FROM ` + d.scheduled + ` WHERE id IN (` + due + `) ORDER BY due_at, id`,
		Args: args,
	}, {
		SQL:  `DELETE FROM ` + d.scheduled + ` WHERE id IN (` + due + `)`,
		Args: args,
	}}
	return sqlstore.DueMove{Move: func([]int64) []sqladapters.Query { return qs }}
}

// RetryMove returns false: SQLite's one writer never deadlocks.
func (d *sqlDialect) RetryMove(error) bool { return false }

// nextDueMicros is the earliest due time of the scheduled table, NULL when
// it is empty; it reads one entry of the due-time index.
func (d *sqlDialect) nextDueMicros() string {
	return `(SELECT due_at FROM ` + d.scheduled + ` ORDER BY due_at, id LIMIT 1)`
}

// NextDue selects the earliest due time.
func (d *sqlDialect) NextDue() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT ` + d.nextDueMicros()}
}
