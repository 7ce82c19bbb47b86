package sqlite

import (
	"strings"

	"github.com/millbox/millbox/sqladapters"
)

const (
	// MaxMessageBytes is the largest message the dialect stores, counting
	// its topic, UUID, payload, metadata and ordering key. SQLite's
	// default SQLITE_MAX_LENGTH, 1,000,000,000 bytes, bounds every value
	// and every row; this leaves room for the row's other columns.
	MaxMessageBytes = 1_000_000_000 - 1<<16

	// savepoint names the savepoint a Publish call of several statements
	// writes under.
	savepoint = `millbox_publish`
)

// MaxMessageBytes returns MaxMessageBytes; the publisher refuses larger
// messages before it writes anything.
func (d *sqlDialect) MaxMessageBytes() int { return MaxMessageBytes }

// Savepoint returns the statements the publisher writes a call of several
// INSERTs under, so that a failed call leaves nothing behind.
func (d *sqlDialect) Savepoint() (set, rollback, release sqladapters.Query, ok bool) {
	return sqladapters.Query{SQL: `SAVEPOINT ` + savepoint},
		sqladapters.Query{SQL: `ROLLBACK TO SAVEPOINT ` + savepoint},
		sqladapters.Query{SQL: `RELEASE SAVEPOINT ` + savepoint}, true
}

// InsertOutbox inserts msgs with one multi-row INSERT per 5,000 messages.
// SQLite assigns ids in VALUES order, and AUTOINCREMENT keeps them above
// every id ever used. There is no notification: forwarders poll.
func (d *sqlDialect) InsertOutbox(msgs []sqladapters.OutboxMessage) []sqladapters.Query {
	var qs []sqladapters.Query
	for start := 0; start < len(msgs); start += rowsPerInsert {
		end := min(start+rowsPerInsert, len(msgs))
		qs = append(qs, d.insertChunk(msgs[start:end]))
	}
	return qs
}

func (d *sqlDialect) insertChunk(msgs []sqladapters.OutboxMessage) sqladapters.Query {
	var b strings.Builder
	b.Grow(80 + len(msgs)*len("(?,?,?,?,?,?),"))
	b.WriteString("INSERT INTO ")
	b.WriteString(d.outbox)
	b.WriteString(" (topic, uuid, payload, metadata, key, key_hash) VALUES ")
	args := make([]any, 0, len(msgs)*6)
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?,?)")
		var key any
		if m.Key != "" {
			key = m.Key
		}
		payload := m.Payload
		if payload == nil {
			// A nil []byte binds as NULL; the column wants an empty blob.
			payload = []byte{}
		}
		// Metadata goes in as text: bound as []byte it would be stored
		// as a BLOB despite the TEXT column.
		metadata := string(m.Metadata)
		if metadata == "" {
			metadata = "{}"
		}
		args = append(args, m.Topic, m.UUID, payload, metadata, key, m.KeyHash)
	}
	return sqladapters.Query{SQL: b.String(), Args: args}
}
