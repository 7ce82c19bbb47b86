package ops

import (
	"context"

	"github.com/millbox/millbox/sqladapters"
)

// An error group of GroupDeadLetters is the dead letters whose last error
// is exactly one text, while Filter.ErrorContains matches a substring: the
// group "timeout" would also catch "read timeout". The functions below act
// on exactly one group, for front ends that offer a group's rows or a
// button per group. They narrow the substring match in Go, so they read
// the rows of groups whose error contains the text, a page at a time.

// groupPage is the page size used to scan for a group's rows.
const groupPage = 500

// ListErrorGroup returns up to limit dead letters whose last error is
// exactly errText, with id > afterID, in id order (limit 0 means
// DefaultListLimit), and the id to continue after, 0 when there are no
// more.
func (o *Ops) ListErrorGroup(ctx context.Context, errText string, afterID int64, limit int) ([]sqladapters.DeadLetter, int64, error) {
	if limit == 0 {
		limit = DefaultListLimit
	}
	if _, err := batchSize(limit); err != nil {
		return nil, 0, err
	}
	var out []sqladapters.DeadLetter
	more := false
	err := o.scanErrorGroup(ctx, errText, afterID, func(dl sqladapters.DeadLetter) bool {
		if len(out) == limit {
			more = true
			return false
		}
		out = append(out, dl)
		return true
	})
	if err != nil {
		return nil, 0, err
	}
	var next int64
	if more {
		next = out[len(out)-1].ID
	}
	return out, next, nil
}

// RequeueErrorGroup makes the dead letters whose last error is exactly
// errText pending again with zero attempts, as Requeue does, and returns
// how many it requeued.
func (o *Ops) RequeueErrorGroup(ctx context.Context, errText string, opts ChangeOptions) (int64, error) {
	return o.changeErrorGroup(ctx, "requeue dead letters", errText, opts, o.d.RequeueDeadLetters)
}

// DiscardErrorGroup deletes the dead letters whose last error is exactly
// errText, as Discard does, and returns how many it deleted.
func (o *Ops) DiscardErrorGroup(ctx context.Context, errText string, opts ChangeOptions) (int64, error) {
	return o.changeErrorGroup(ctx, "discard dead letters", errText, opts, o.d.DeleteDeadLetters)
}

func (o *Ops) changeErrorGroup(ctx context.Context, op, errText string, opts ChangeOptions, stmt func([]int64) sqladapters.Query) (int64, error) {
	batch, err := batchSize(opts.BatchSize)
	if err != nil {
		return 0, err
	}
	var total int64
	var ids []int64
	flush := func() error {
		if len(ids) == 0 {
			return nil
		}
		n, err := stmt(ids).Exec(ctx, o.db)
		if err != nil {
			return o.fail(op, err)
		}
		total += n
		ids = ids[:0]
		if opts.Progress != nil {
			opts.Progress(total)
		}
		return nil
	}
	var flushErr error
	err = o.scanErrorGroup(ctx, errText, 0, func(dl sqladapters.DeadLetter) bool {
		ids = append(ids, dl.ID)
		if len(ids) == batch {
			flushErr = flush()
		}
		return flushErr == nil
	})
	if err == nil {
		err = flushErr
	}
	if err == nil {
		err = flush()
	}
	return total, err
}

// scanErrorGroup calls yield for the dead letters whose last error is
// exactly errText with id > afterID, in id order, until yield returns
// false or none is left.
func (o *Ops) scanErrorGroup(ctx context.Context, errText string, afterID int64, yield func(sqladapters.DeadLetter) bool) error {
	f := Filter{ErrorContains: errText}
	for {
		page, err := o.ListDeadLetters(ctx, f, afterID, groupPage)
		if err != nil {
			return err
		}
		for _, dl := range page {
			if dl.LastError == errText && !yield(dl) {
				return nil
			}
		}
		if len(page) < groupPage {
			return nil
		}
		afterID = page[len(page)-1].ID
	}
}
