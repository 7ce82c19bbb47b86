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

	head    bool                // a head read (see horizon.go)
	horizon sqladapters.Horizon // looked at before a head read
	looked  bool                // horizon holds a look
}

// read returns up to limit due rows of the owned partitions (nil: all)
// with ids above after, leaving out the ids in exclude. backlog tells the
// dialect that the last read was full (see
// sqladapters.Dialect.ReadPending). A head read looks at the horizon
// first; if that fails, it reads all the same and the floor stays.
func (f *Forwarder) read(ctx context.Context, owned []int, exclude []int64, limit int, backlog, head bool, after int64) readResult {
	var res readResult
	if head {
		res.head = true
		h, err := f.cfg.Dialect.PendingHorizon(ctx, f.cfg.DB)
		res.horizon, res.looked = h, err == nil
	}
	q := sqladapters.PendingQuery{Partitions: f.cfg.Partitions, Owned: owned, Limit: limit, Exclude: exclude, After: after}
	res.readAt = time.Now()
	rows, err := f.cfg.Dialect.ReadPending(ctx, f.cfg.DB, q, backlog)
	if err != nil {
		return readResult{err: fmt.Errorf("millbox: read outbox: %w", err)}
	}
	res.rows, res.full = rows, len(rows) >= limit
	return res
}
