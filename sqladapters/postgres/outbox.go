package postgres

import (
	"strconv"
	"strings"

	"github.com/millbox/millbox/sqladapters"
)

const (
	// MaxMessageBytes is the largest message the dialect stores, counting
	// its topic, UUID, payload, metadata and ordering key. The metadata
	// goes into a jsonb column, which holds at most 255 MiB, and jsonb's
	// form of a map of many short fields can exceed its JSON text by a
	// third; 192 MiB stays below that whatever the fields.
	MaxMessageBytes = 192 << 20

	// insertBudget bounds the argument bytes of one INSERT, counted twice
	// (drivers sending text parameters, such as lib/pq, hex-encode bytea),
	// so that a statement stays far below the 1 GiB Postgres accepts in
	// one protocol message.
	insertBudget = 256 << 20

	// savepoint names the savepoint a Publish call of several statements
	// writes under.
	savepoint = `millbox_publish`
)

// flushStats is the condition that asks the session to report its
// statistics when its transaction ends (Options.FlushStats); the function
// returns void, which is not null.
const flushStats = `(SELECT pg_stat_force_next_flush()) IS NOT NULL`

// InsertOutbox inserts msgs with one multi-row INSERT per 5,000 messages,
// or per insertBudget bytes when the messages are large. With
// notifications on, the last statement also calls pg_notify in the same
// round trip; Postgres delivers it on commit and folds repeats within one
// transaction into one.
//
// The rows come from a VALUES list behind a one-time filter on
// pg_current_xact_id(), which gives the transaction its id before the
// identity default draws the rows' ids (a plain INSERT draws them first
// and takes the transaction id when it writes the first row). So every
// row belongs to a transaction that had an id when its row id was
// drawn, which is what PendingHorizon relies on. The VALUES columns carry
// their types: in a subquery they are not taken from the table.
func (d *sqlDialect) InsertOutbox(msgs []sqladapters.OutboxMessage) []sqladapters.Query {
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
		qs = append(qs, d.insertChunk(msgs[start:end], end == len(msgs) && d.channel != ""))
		start = end
	}
	return qs
}

// MaxMessageBytes returns MaxMessageBytes; the publisher refuses larger
// messages before it writes anything.
func (d *sqlDialect) MaxMessageBytes() int { return MaxMessageBytes }

// Savepoint returns the statements the publisher writes a call of several
// INSERTs under, so that a failed call leaves nothing behind and the
// transaction usable.
func (d *sqlDialect) Savepoint() (set, rollback, release sqladapters.Query, ok bool) {
	return sqladapters.Query{SQL: `SAVEPOINT ` + savepoint},
		sqladapters.Query{SQL: `ROLLBACK TO SAVEPOINT ` + savepoint},
		sqladapters.Query{SQL: `RELEASE SAVEPOINT ` + savepoint}, true
}

// insertTypes are the casts of one row's parameters, in column order.
var insertTypes = [...]string{"::text", "::text", "::bytea", "::jsonb", "::text", "::integer"}

func (d *sqlDialect) insertChunk(msgs []sqladapters.OutboxMessage, notify bool) sqladapters.Query {
	var b strings.Builder
	args := make([]any, 0, len(msgs)*6+1)
	if notify {
		b.WriteString("WITH ins AS (")
	}
	b.WriteString("INSERT INTO ")
	b.WriteString(d.outbox)
	b.WriteString(" (topic, uuid, payload, metadata, key, key_hash) SELECT * FROM (VALUES ")
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		n := len(args)
		for j, typ := range insertTypes {
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
		args = append(args, m.Topic, m.UUID, m.Payload, string(m.Metadata), key, m.KeyHash)
	}
	b.WriteString(") v WHERE pg_current_xact_id() IS NOT NULL")
	if d.opts.FlushStats {
		// An InitPlan, run once, after the transaction id is taken.
		b.WriteString(" AND " + flushStats)
	}
	if notify {
		args = append(args, d.channel)
		b.WriteString(") SELECT pg_notify($")
		b.WriteString(strconv.Itoa(len(args)))
		b.WriteString(", '')")
	}
	return sqladapters.Query{SQL: b.String(), Args: args}
}

// NotifyProbe returns the statement a forwarder checks its listener with:
// a notification on NotifyChannel with the payload "probe", for someone
// watching the channel by hand; listeners wake for it as for a commit. It
// is only meaningful with Options.Notify.
func (d *sqlDialect) NotifyProbe() (sqladapters.Query, bool) {
	return sqladapters.Query{SQL: `SELECT pg_notify($1, 'probe')`, Args: []any{d.channel}}, true
}
