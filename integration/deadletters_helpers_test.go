package integration_test

import (
	"context"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/ops"
)

// listDeadLetters lists up to ten dead letters of d, as an operator's
// tool does.
func listDeadLetters(ctx context.Context, db sqladapters.Executor, d sqladapters.Dialect) ([]sqladapters.DeadLetter, error) {
	o, err := ops.New(db, d)
	if err != nil {
		return nil, err
	}
	return o.ListDeadLetters(ctx, ops.ListQuery{Limit: 10})
}

// requeueAll requeues every dead letter of d.
func requeueAll(ctx context.Context, db sqladapters.Executor, d sqladapters.Dialect) (int64, error) {
	o, err := ops.New(db, d)
	if err != nil {
		return 0, err
	}
	return o.Requeue(ctx, ops.Filter{All: true}, ops.ChangeOptions{})
}
