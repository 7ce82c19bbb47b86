package postgres

import (
	"strconv"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// InsertInbox inserts the inbox key with ON CONFLICT DO NOTHING: a second
// transaction inserting the same key waits for the first and then affects
// zero rows if it committed, or inserts if it rolled back.
func (d *sqlDialect) InsertInbox(consumer, messageID string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `INSERT INTO ` + d.inbox + ` (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
		Args: []any{consumer, messageID},
	}
}

// DeleteInboxBefore deletes up to limit rows received before t, oldest
// first. The subquery walks received_idx and collects the rows' physical
// addresses, which the delete then visits directly (a TID scan): no second
// lookup by key, and no plan that joins the whole table. The limit is
// inlined so that a prepared statement's generic plan knows how few rows it
// reads. The outer condition repeats the cutoff, so a delete never touches
// a row that is not old, whatever happened to its address.
func (d *sqlDialect) DeleteInboxBefore(t time.Time, limit int) sqladapters.Query {
	return sqladapters.Query{
		SQL: `DELETE FROM ` + d.inbox + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + d.inbox + ` WHERE received_at < $1 ORDER BY received_at LIMIT ` + strconv.Itoa(limit) + `))
AND received_at < $1`,
		Args: []any{t},
	}
}

// DeleteInboxRange deletes up to limit rows received in [from, before),
// oldest first, as DeleteInboxBefore does, and returns the number deleted
// and the latest received_at among them (from when none). The cleaner
// passes that back as the next batch's from, so each batch's index scan
// starts after the entries of the rows already deleted, which stay in
// received_idx until vacuum; from the start, a batch late in the deletion
// of millions of rows would walk every one of them.
func (d *sqlDialect) DeleteInboxRange(from, before time.Time, limit int) (sqladapters.Query, bool) {
	return sqladapters.Query{
		SQL: `WITH deleted AS (
	DELETE FROM ` + d.inbox + ` WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM ` + d.inbox + ` WHERE received_at >= $1 AND received_at < $2
		ORDER BY received_at LIMIT ` + strconv.Itoa(limit) + `))
	AND received_at >= $1 AND received_at < $2
	RETURNING received_at)
SELECT count(*), coalesce(max(received_at), $1) FROM deleted`,
		Args: []any{from, before},
	}, true
}
