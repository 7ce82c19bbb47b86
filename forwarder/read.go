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

	head          bool                // a head read (see horizon.go)
	before, after sqladapters.Horizon // looked at around a head read
	lookErr       error               // a look failed; the floor stays
}

// read returns up to limit due rows of the owned partitions (nil: all)
// with ids above after, leaving out the ids in exclude. backlog tells the
// dialect that the last read was full (see
// sqladapters.Dialect.ReadPending). A head read looks at the horizon
// before and after; if a look fails, it reads all the same and the floor
// stays.
func (f *Forwarder) read(ctx context.Context, owned []int, exclude []int64, limit int, backlog, head bool, after int64) readResult {
	var res readResult
	if head {
		res.head = true
		res.before, res.lookErr = f.cfg.Dialect.PendingHorizon(ctx, f.cfg.DB)
	}
	q := sqladapters.PendingQuery{Partitions: f.cfg.Partitions, Owned: owned, Limit: limit, Exclude: exclude, After: after}
	res.readAt = time.Now()
	rows, err := f.cfg.Dialect.ReadPending(ctx, f.cfg.DB, q, backlog)
	if err != nil {
		return readResult{err: fmt.Errorf("millbox: read outbox: %w", err)}
	}
	res.rows, res.full = rows, len(rows) >= limit
	if head && res.lookErr == nil {
		res.after, res.lookErr = f.cfg.Dialect.PendingHorizon(ctx, f.cfg.DB)
	}
	return res
}
