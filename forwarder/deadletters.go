package forwarder

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/millbox/millbox/sqladapters"
)

// DeadLetters returns up to limit dead rows with id > afterID, in id order,
// with their last error. Page through them by passing the last id seen.
func DeadLetters(ctx context.Context, db sqladapters.Executor, d sqladapters.Dialect, afterID int64, limit int) ([]sqladapters.DeadLetter, error) {
	if db == nil || d == nil {
		return nil, errors.New("millbox: DeadLetters needs a database and a dialect")
	}
	if limit <= 0 {
		limit = 100
	}
	rows, err := d.ListDeadLetters(afterID, limit).Query(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("millbox: list dead letters: %w", d.ClassifyError(err))
	}
	defer rows.Close()
	var out []sqladapters.DeadLetter
	for rows.Next() {
		var dl sqladapters.DeadLetter
		var key sql.NullString
		if err := rows.Scan(&dl.ID, &dl.Topic, &dl.UUID, &dl.Payload, &dl.Metadata, &key, &dl.Attempts,
			&dl.LastError, &dl.CreatedAt, &dl.DeadAt); err != nil {
			return nil, fmt.Errorf("millbox: read dead letter: %w", err)
		}
		dl.Key = key.String
		out = append(out, dl)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("millbox: list dead letters: %w", d.ClassifyError(err))
	}
	return out, nil
}

// Backlog is the size of an outbox.
type Backlog struct {
	// Pending rows wait to be published, including rows waiting for a
	// retry after a failure.
	Pending int64
	// Dead rows exhausted their attempts (see DeadLetters).
	Dead int64
}

// OutboxBacklog counts the pending and dead rows of the outbox, for
// metrics and for waiting until an outbox drained.
func OutboxBacklog(ctx context.Context, db sqladapters.Executor, d sqladapters.Dialect) (Backlog, error) {
	var b Backlog
	if db == nil || d == nil {
		return b, errors.New("millbox: OutboxBacklog needs a database and a dialect")
	}
	rows, err := d.CountOutbox().Query(ctx, db)
	if err != nil {
		return b, fmt.Errorf("millbox: count outbox: %w", d.ClassifyError(err))
	}
	defer rows.Close()
	if rows.Next() {
		if err := rows.Scan(&b.Pending, &b.Dead); err != nil {
			return b, fmt.Errorf("millbox: count outbox: %w", err)
		}
	}
	return b, rows.Err()
}

// RequeueDeadLetters makes the given dead rows pending again with zero
// attempts (their last error is kept until they are published). With no
// ids it requeues every dead row. It returns the number of rows requeued.
// A requeued row goes out as soon as it is due: rows of its key that were
// published while it was dead have gone ahead of it.
func RequeueDeadLetters(ctx context.Context, db sqladapters.Executor, d sqladapters.Dialect, ids ...int64) (int64, error) {
	if db == nil || d == nil {
		return 0, errors.New("millbox: RequeueDeadLetters needs a database and a dialect")
	}
	var q sqladapters.Query
	if len(ids) == 0 {
		q = d.RequeueDeadLetters(nil)
	} else {
		q = d.RequeueDeadLetters(ids)
	}
	n, err := q.Exec(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("millbox: requeue dead letters: %w", d.ClassifyError(err))
	}
	return n, nil
}
