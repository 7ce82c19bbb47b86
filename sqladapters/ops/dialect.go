package ops

import (
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
)

// builder builds the SQL of the operations, on top of the store's
// statements. The SQL builders behind the dialects of sqladapters/postgres,
// sqladapters/mysql and sqladapters/sqlite implement it; New refuses a
// dialect without one.
//
// Ages and remaining lease times are computed by the database, in
// microseconds, so the clock of the machine running the operation does not
// matter. Times in Where and the prune methods are compared with the
// stored timestamps (UTC).
type builder interface {
	sqlstore.Builder

	// TopicStats selects, per topic in topic order: topic, pending rows
	// (including rows waiting for a retry), rows waiting for a retry, dead
	// rows, forwarded rows kept, and the age of the oldest pending row in
	// microseconds (NULL when none is pending).
	TopicStats() sqladapters.Query
	// InboxStats selects, per consumer in consumer order: consumer,
	// records, and the age of the oldest record in microseconds.
	InboxStats() sqladapters.Query
	// PartitionLeases selects, per partition in order: partition, the
	// owner holding an unexpired lease (NULL when free or expired), and
	// the microseconds until that lease expires (NULL when free or
	// expired).
	PartitionLeases() sqladapters.Query

	// SelectDeadLetters selects the dead rows matching w with id >
	// afterID, in id order, at most limit, with the columns of
	// sqlstore.Builder.ListDeadLetters.
	SelectDeadLetters(w Where, afterID int64, limit int) sqladapters.Query
	// SelectDeadLetterIDs selects the ids (one bigint column) of the dead
	// rows matching w with id > afterID, in id order, at most limit.
	SelectDeadLetterIDs(w Where, afterID int64, limit int) sqladapters.Query
	// CountDeadLetters selects the number of dead rows matching w.
	CountDeadLetters(w Where) sqladapters.Query
	// GroupDeadLetters selects, per distinct last error of the dead rows
	// matching w, most rows first, at most limit groups: last error ('' when
	// none), rows, the lowest id, and the ages in microseconds of the
	// earliest and of the latest death.
	GroupDeadLetters(w Where, limit int) sqladapters.Query
	// DeleteDeadLetters deletes the given rows that are still dead; a row
	// requeued in the meantime stays.
	DeleteDeadLetters(ids []int64) sqladapters.Query

	// CountForwardedBefore selects the number of forwarded rows kept
	// (published_at set) that were published before t.
	CountForwardedBefore(t time.Time) sqladapters.Query
	// SelectForwardedIDs selects the ids (one bigint column) of forwarded
	// rows published before t with id > afterID, in id order, at most
	// limit. Callers delete them with CompleteForwarded(ids, false): a
	// forwarded row never becomes pending again.
	SelectForwardedIDs(t time.Time, afterID int64, limit int) sqladapters.Query
	// CountInboxBefore selects the number of inbox records received before
	// t. Callers delete them with DeleteInboxBefore.
	CountInboxBefore(t time.Time) sqladapters.Query
}

// Where selects dead letters in the operations' statements. Every set field must
// match; the zero Where matches every dead row.
type Where struct {
	// IDs, when not empty, limits the rows to these ids.
	IDs []int64
	// Topic, when set, is the exact topic.
	Topic string
	// Key, when set, is the exact ordering key.
	Key string
	// ErrorContains, when set, is a substring of the last error,
	// compared case-sensitively.
	ErrorContains string
	// DeadBefore, when not zero, keeps rows that died before it.
	DeadBefore time.Time
	// DeadAfter, when not zero, keeps rows that died at or after it.
	DeadAfter time.Time
}
