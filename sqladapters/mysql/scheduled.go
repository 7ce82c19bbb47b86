package mysql

import (
	"errors"
	"strings"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
)

// scheduledRowsPerInsert keeps one INSERT of scheduled rows (7
// placeholders a row) under MySQL's 65,535 placeholders per statement.
const scheduledRowsPerInsert = 9000

// scheduledTable returns the statement of version 7: the table of
// scheduled messages, with its index on the due time inline.
func (d *sqlDialect) scheduledTable() []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + d.scheduled + ` (
	id           BIGINT       NOT NULL AUTO_INCREMENT,` + messageColumnsDDL + `
	due_at       DATETIME(6)  NOT NULL,
	PRIMARY KEY (id),
	KEY due_idx (due_at, id)
)` + tableOptions,
	}
}

// InsertScheduled inserts msgs into the scheduled table with multi-row
// INSERTs of at most 9,000 rows and about Options.MaxInsertBytes each;
// AUTO_INCREMENT values follow the row order (see InsertOutbox).
func (d *sqlDialect) InsertScheduled(msgs []sqladapters.OutboxMessage) []sqladapters.Query {
	var qs []sqladapters.Query
	for start := 0; start < len(msgs); {
		end, size := start, 0
		for end < len(msgs) && end-start < scheduledRowsPerInsert {
			n := rowSize(msgs[end])
			if end > start && size+n > d.opts.MaxInsertBytes {
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
	const tuple = `(?,?,?,?,?,?,` + now + `,?)`
	var b strings.Builder
	b.Grow(100 + len(msgs)*(len(tuple)+1))
	b.WriteString("INSERT INTO ")
	b.WriteString(d.scheduled)
	b.WriteString(" (topic, uuid, payload, metadata, `key`, key_hash, created_at, due_at) VALUES ")
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
			payload = []byte{} // nil would be NULL
		}
		metadata := string(m.Metadata)
		if metadata == "" {
			metadata = "{}"
		}
		args = append(args, m.Topic, m.UUID, payload, metadata, key, m.KeyHash, utc(m.DueAt))
	}
	return sqladapters.Query{SQL: b.String(), Args: args}
}

// MoveDue claims the earliest due rows with a locking read and then
// inserts them into the outbox by due time and id (InnoDB hands out
// AUTO_INCREMENT values in the order of an INSERT ... SELECT's rows) and
// deletes them. The rows get a new created_at: their age counts from when
// they became due.
//
// The claim never skips locked rows, whatever Options.SkipLocked says:
// every claim reads the due-time index from its start, so a move that
// finds the earliest due row locked waits there until the move holding
// it commits, and then, the rows that move deleted being gone, claims
// the rows due after them. So the earliest due row is the lock that makes
// concurrent moves take turns. Skipping it would let two moves split one
// key's due rows and draw their outbox ids and commit in any order, and
// the forwarder would send the key's rows out of due order.
func (d *sqlDialect) MoveDue(now time.Time, limit int) sqlstore.DueMove {
	return sqlstore.DueMove{
		Claim: sqladapters.Query{
			SQL:  `SELECT id FROM ` + d.scheduled + ` WHERE due_at <= ? ORDER BY due_at, id LIMIT ? FOR UPDATE`,
			Args: []any{utc(now), limit},
		},
		Move: d.moveClaimed,
	}
}

// moveClaimed inserts the claimed rows into the outbox and deletes them.
func (d *sqlDialect) moveClaimed(ids []int64) []sqladapters.Query {
	return []sqladapters.Query{{
		SQL: "INSERT INTO " + d.outbox + " (topic, uuid, payload, metadata, `key`, key_hash, created_at, next_attempt_at)\n" +
			"SELECT topic, uuid, payload, metadata, `key`, key_hash, " + now + `, ` + now + ` FROM ` + d.scheduled +
			` WHERE ` + idIn("id", ids) + ` ORDER BY due_at, id`,
	}, {
		SQL: `DELETE FROM ` + d.scheduled + ` WHERE ` + idIn("id", ids),
	}}
}

// nextDueMicros is the earliest due time of the scheduled table in
// microseconds since the Unix epoch, NULL when it is empty; it reads one
// entry of due_idx.
func (d *sqlDialect) nextDueMicros() string {
	return `(SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', due_at) FROM ` + d.scheduled + ` ORDER BY due_at, id LIMIT 1)`
}

// NextDue selects the earliest due time.
func (d *sqlDialect) NextDue() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT ` + d.nextDueMicros()}
}

// RetryMove tells a deadlock (1213) or a lock wait timeout (1205) apart:
// InnoDB's next-key locks can make concurrent moves of neighbouring rows
// wait for each other, and it resolves that by rolling one back.
func (d *sqlDialect) RetryMove(err error) bool {
	var me *mysqldrv.MySQLError
	return errors.As(err, &me) && (me.Number == erDeadlock || me.Number == erLockWaitTimeout)
}
