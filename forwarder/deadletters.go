package forwarder

import (
	"context"
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
	out, err := d.ListDeadLetters(ctx, db, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("millbox: list dead letters: %w", err)
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
	s, err := d.OutboxStats(ctx, db)
	if err != nil {
		return b, fmt.Errorf("millbox: count outbox: %w", err)
	}
	return Backlog{Pending: s.Pending, Dead: s.Dead}, nil
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
	if len(ids) == 0 {
		ids = nil // every dead row
	}
	n, err := d.RequeueDeadLetters(ctx, db, ids)
	if err != nil {
		return 0, fmt.Errorf("millbox: requeue dead letters: %w", err)
	}
	return n, nil
}
