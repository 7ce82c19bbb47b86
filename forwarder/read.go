package forwarder

import (
	"context"
	"fmt"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// readResult is the outcome of one read of the outbox.
type readResult struct {
	rows   []sqladapters.OutboxRow
	readAt time.Time // when the read started: row ages count from it
	full   bool      // the read hit its limit: more rows are likely due
	err    error
}

// read returns up to limit due rows of the owned partitions (nil: all),
// leaving out the ids in exclude. backlog tells the dialect that the last
// read was full (see sqladapters.Dialect.ReadPending).
func (f *Forwarder) read(ctx context.Context, owned []int, exclude []int64, limit int, backlog bool) readResult {
	q := sqladapters.PendingQuery{Partitions: f.cfg.Partitions, Owned: owned, Limit: limit, Exclude: exclude}
	readAt := time.Now()
	rows, err := f.cfg.Dialect.ReadPending(ctx, f.cfg.DB, q, backlog)
	if err != nil {
		return readResult{err: fmt.Errorf("millbox: read outbox: %w", err)}
	}
	return readResult{rows: rows, readAt: readAt, full: len(rows) >= limit}
}
