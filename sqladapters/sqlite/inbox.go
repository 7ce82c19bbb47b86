package sqlite

import (
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// InsertInbox inserts the inbox key with ON CONFLICT DO NOTHING. SQLite
// runs one writer at a time, so a second transaction inserting the same key
// waits for the first to end (under the busy timeout) and then affects zero
// rows if it committed, or inserts if it rolled back.
func (d *sqlDialect) InsertInbox(consumer, messageID string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `INSERT INTO ` + d.inbox + ` (consumer, message_id) VALUES (?, ?) ON CONFLICT DO NOTHING`,
		Args: []any{consumer, messageID},
	}
}

// DeleteInboxBefore deletes up to limit rows received before t, truncated
// to the millisecond. SQLite's DELETE has no LIMIT in default builds, hence
// the subquery.
func (d *sqlDialect) DeleteInboxBefore(t time.Time, limit int) sqladapters.Query {
	return sqladapters.Query{
		SQL: `DELETE FROM ` + d.inbox + ` WHERE (consumer, message_id) IN (
	SELECT consumer, message_id FROM ` + d.inbox + ` WHERE received_at < ? LIMIT ?)`,
		Args: []any{formatTime(t), limit},
	}
}
