package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// PruneOptions says what Prune deletes. A zero age leaves that table
// alone.
type PruneOptions struct {
	// ForwardedOlderThan deletes forwarded rows kept for audit
	// (forwarder.Config.KeepForwarded) that were published longer ago
	// than this. Pending rows and dead letters are never deleted.
	ForwardedOlderThan time.Duration
	// InboxOlderThan deletes inbox records received longer ago than
	// this. A message redelivered after its record is gone runs its
	// handler again, so keep records longer than any redelivery can take.
	InboxOlderThan time.Duration
	// BatchSize is the number of rows deleted per statement. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// Progress, when set, is called before the first batch and after
	// every batch of each table.
	Progress func(PruneProgress)
}

// Tables Prune reports progress on.
const (
	TableForwarded = "forwarded"
	TableInbox     = "inbox"
)

// PruneProgress reports how far Prune got in one table.
type PruneProgress struct {
	// Table is TableForwarded or TableInbox.
	Table string
	// Deleted rows so far.
	Deleted int64
	// Total is the number of rows old enough when the table's pruning
	// started. Rows that age meanwhile are deleted too, so Deleted may
	// end above it.
	Total int64
	// Done is true in the last report of the table.
	Done bool
}

// PruneResult counts the rows Prune deleted.
type PruneResult struct {
	Forwarded    int64
	InboxRecords int64
}

// Prune deletes forwarded rows and inbox records older than the ages in
// opts, in batches of single statements, so it can run while forwarders
// and consumers work. Ages count back from the start of the call.
func (o *Ops) Prune(ctx context.Context, opts PruneOptions) (PruneResult, error) {
	var res PruneResult
	batch, err := batchSize(opts.BatchSize)
	if err != nil {
		return res, err
	}
	if opts.ForwardedOlderThan < 0 || opts.InboxOlderThan < 0 {
		return res, fmt.Errorf("%w: prune ages must not be negative", sqladapters.ErrInvalidConfig)
	}
	now := time.Now()
	report := func(p PruneProgress) {
		if opts.Progress != nil {
			opts.Progress(p)
		}
	}
	if opts.ForwardedOlderThan > 0 {
		before := now.Add(-opts.ForwardedOlderThan)
		p := PruneProgress{Table: TableForwarded}
		if p.Total, err = o.d.CountForwardedBefore(ctx, o.db, before); err != nil {
			return res, fail("count forwarded rows", err)
		}
		report(p)
		var after int64
		for {
			ids, err := o.d.ForwardedIDsBefore(ctx, o.db, before, after, batch)
			if err != nil {
				return res, fail("prune forwarded rows", err)
			}
			if len(ids) > 0 {
				n, err := o.d.DeleteForwarded(ctx, o.db, ids)
				if err != nil {
					return res, fail("prune forwarded rows", err)
				}
				p.Deleted += n
				res.Forwarded = p.Deleted
				after = ids[len(ids)-1]
			}
			p.Done = len(ids) < batch
			report(p)
			if p.Done {
				break
			}
			if err := ctx.Err(); err != nil {
				return res, err
			}
		}
	}
	if opts.InboxOlderThan > 0 {
		before := now.Add(-opts.InboxOlderThan)
		p := PruneProgress{Table: TableInbox}
		if p.Total, err = o.d.CountInboxBefore(ctx, o.db, before); err != nil {
			return res, fail("count inbox records", err)
		}
		report(p)
		var from time.Time
		for {
			n, next, err := o.d.DeleteInbox(ctx, o.db, from, before, batch)
			if err != nil {
				return res, fail("prune inbox records", err)
			}
			from = next
			p.Deleted += n
			res.InboxRecords = p.Deleted
			p.Done = n < int64(batch)
			report(p)
			if p.Done {
				break
			}
			if err := ctx.Err(); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// PruneCount counts what Prune with the same options would delete now, for
// a dry run. It changes nothing.
func (o *Ops) PruneCount(ctx context.Context, opts PruneOptions) (PruneResult, error) {
	var res PruneResult
	var err error
	now := time.Now()
	if opts.ForwardedOlderThan > 0 {
		if res.Forwarded, err = o.d.CountForwardedBefore(ctx, o.db, now.Add(-opts.ForwardedOlderThan)); err != nil {
			return res, fail("count forwarded rows", err)
		}
	}
	if opts.InboxOlderThan > 0 {
		if res.InboxRecords, err = o.d.CountInboxBefore(ctx, o.db, now.Add(-opts.InboxOlderThan)); err != nil {
			return res, fail("count inbox records", err)
		}
	}
	return res, nil
}
