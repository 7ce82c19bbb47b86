package sqlite

import (
	"strings"

	"github.com/millbox/millbox/sqladapters"
)

// InsertOutbox inserts msgs with one multi-row INSERT per 5,000 messages.
// SQLite assigns ids in VALUES order, and AUTOINCREMENT keeps them above
// every id ever used. There is no notification: forwarders poll.
func (d *Dialect) InsertOutbox(msgs []sqladapters.OutboxMessage) []sqladapters.Query {
	var qs []sqladapters.Query
	for start := 0; start < len(msgs); start += rowsPerInsert {
		end := min(start+rowsPerInsert, len(msgs))
		qs = append(qs, d.insertChunk(msgs[start:end]))
	}
	return qs
}

func (d *Dialect) insertChunk(msgs []sqladapters.OutboxMessage) sqladapters.Query {
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
