package mysql

import (
	"strings"

	"github.com/millbox/millbox/sqladapters"
)

// InsertOutbox inserts msgs with multi-row INSERTs of at most 10,000 rows
// and about Options.MaxInsertBytes each. InnoDB hands out AUTO_INCREMENT
// values in row order within a statement, and later statements get larger
// ones, under every innodb_autoinc_lock_mode, so ids follow the order of
// msgs.
func (d *sqlDialect) InsertOutbox(msgs []sqladapters.OutboxMessage) []sqladapters.Query {
	var qs []sqladapters.Query
	for start := 0; start < len(msgs); {
		end, size := start, 0
		for end < len(msgs) && end-start < rowsPerInsert {
			n := rowSize(msgs[end])
			if end > start && size+n > d.opts.MaxInsertBytes {
				break
			}
			size += n
			end++
		}
		qs = append(qs, d.insertChunk(msgs[start:end]))
		start = end
	}
	return qs
}

// rowSize estimates the bytes one message adds to an INSERT, counting its
// arguments twice because escaping may double them.
func rowSize(m sqladapters.OutboxMessage) int {
	return 2*(len(m.Topic)+len(m.UUID)+len(m.Payload)+len(m.Metadata)+len(m.Key)) + rowOverhead
}

func (d *sqlDialect) insertChunk(msgs []sqladapters.OutboxMessage) sqladapters.Query {
	const tuple = `(?,?,?,?,?,?,` + now + `,` + now + `)`
	var b strings.Builder
	b.Grow(100 + len(msgs)*(len(tuple)+1))
	b.WriteString("INSERT INTO ")
	b.WriteString(d.outbox)
	b.WriteString(" (topic, uuid, payload, metadata, `key`, key_hash, created_at, next_attempt_at) VALUES ")
	args := make([]any, 0, len(msgs)*6)
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
		args = append(args, m.Topic, m.UUID, payload, metadata, key, m.KeyHash)
	}
	return sqladapters.Query{SQL: b.String(), Args: args}
}
