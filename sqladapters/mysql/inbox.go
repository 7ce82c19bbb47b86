package mysql

import (
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// InsertInbox inserts the inbox key with INSERT IGNORE. A second
// transaction inserting the same key waits for the first (InnoDB locks the
// duplicate index record) and then affects zero rows if it committed, or
// inserts if it rolled back, under REPEATABLE READ and READ COMMITTED
// alike.
//
// IGNORE would also turn other errors into warnings, chiefly truncation of
// an over-long value, which could make two different ids one key. That
// cannot happen here: the key columns are VARBINARY, so there is no
// character set to convert and no collation to fold case or trailing
// spaces, and a value longer than its column is stored as its digest
// (fitKey) instead of being cut. The alternative, ON DUPLICATE KEY UPDATE
// with a no-op, would report a duplicate as one affected row on
// connections with the driver's clientFoundRows option, and take an
// exclusive lock on the existing row.
//
// Rarely, when several transactions wait for the same key and its first
// inserter rolls back, InnoDB resolves their insert race with a deadlock
// error (1213) for all but one of them; the inbox middleware then rolls
// back and the message is redelivered, which finds the key committed.
func (d *sqlDialect) InsertInbox(consumer, messageID string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `INSERT IGNORE INTO ` + d.inbox + ` (consumer, message_id, received_at) VALUES (?, ?, ` + now + `)`,
		Args: []any{fitKey(consumer, maxConsumerBytes), fitKey(messageID, maxMessageIDBytes)},
	}
}

// DeleteInboxBefore deletes up to limit rows received before t, oldest
// first, through received_idx. t is sent as UTC text, so the driver's loc
// setting cannot shift it.
func (d *sqlDialect) DeleteInboxBefore(t time.Time, limit int) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `DELETE FROM ` + d.inbox + ` WHERE received_at < ? ORDER BY received_at LIMIT ?`,
		Args: []any{t.UTC().Format(timeLayout), limit},
	}
}
