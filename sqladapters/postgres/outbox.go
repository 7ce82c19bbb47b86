package postgres

import (
	"strconv"
	"strings"

	"github.com/millbox/millbox/sqladapters"
)

// InsertOutbox inserts msgs with one multi-row INSERT per 5,000 messages.
// With notifications on, the last statement also calls pg_notify in the
// same round trip; Postgres delivers it on commit and folds repeats within
// one transaction into one.
func (d *Dialect) InsertOutbox(msgs []sqladapters.OutboxMessage) []sqladapters.Query {
	var qs []sqladapters.Query
	for start := 0; start < len(msgs); start += rowsPerInsert {
		end := min(start+rowsPerInsert, len(msgs))
		qs = append(qs, d.insertChunk(msgs[start:end], end == len(msgs) && d.channel != ""))
	}
	return qs
}

func (d *Dialect) insertChunk(msgs []sqladapters.OutboxMessage, notify bool) sqladapters.Query {
	var b strings.Builder
	args := make([]any, 0, len(msgs)*6+1)
	if notify {
		b.WriteString("WITH ins AS (")
	}
	b.WriteString("INSERT INTO ")
	b.WriteString(d.outbox)
	b.WriteString(" (topic, uuid, payload, metadata, key, key_hash) VALUES ")
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		n := len(args)
		b.WriteString("($")
		for j := 1; j <= 6; j++ {
			if j > 1 {
				b.WriteString(",$")
			}
			b.WriteString(strconv.Itoa(n + j))
		}
		b.WriteByte(')')
		var key any
		if m.Key != "" {
			key = m.Key
		}
		args = append(args, m.Topic, m.UUID, m.Payload, string(m.Metadata), key, m.KeyHash)
	}
	if notify {
		args = append(args, d.channel)
		b.WriteString(") SELECT pg_notify($")
		b.WriteString(strconv.Itoa(len(args)))
		b.WriteString(", '')")
	}
	return sqladapters.Query{SQL: b.String(), Args: args}
}
