package ops

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// ListDeadLetters returns up to limit dead letters matching f with id >
// afterID, in id order (limit 0 means DefaultListLimit). Page through them
// by passing the last id seen.
func (o *Ops) ListDeadLetters(ctx context.Context, f Filter, afterID int64, limit int) ([]sqladapters.DeadLetter, error) {
	if limit == 0 {
		limit = DefaultListLimit
	}
	if limit < 1 || limit > MaxBatchSize {
		return nil, fmt.Errorf("%w: limit must be between 1 and %d, got %d", sqladapters.ErrInvalidConfig, MaxBatchSize, limit)
	}
	var out []sqladapters.DeadLetter
	err := o.query(ctx, "list dead letters", o.d.SelectDeadLetters(f.Where(time.Now()), afterID, limit), func(r sqladapters.Rows) error {
		var dl sqladapters.DeadLetter
		var key sql.NullString
		if err := r.Scan(&dl.ID, &dl.Topic, &dl.UUID, &dl.Payload, &dl.Metadata, &key, &dl.Attempts,
			&dl.LastError, &dl.CreatedAt, &dl.DeadAt); err != nil {
			return err
		}
		dl.Key = key.String
		out = append(out, dl)
		return nil
	})
	return out, err
}

// ShowDeadLetter returns the dead letter with the given id, or ErrNotFound.
func (o *Ops) ShowDeadLetter(ctx context.Context, id int64) (sqladapters.DeadLetter, error) {
	dls, err := o.ListDeadLetters(ctx, Filter{IDs: []int64{id}}, 0, 1)
	if err != nil {
		return sqladapters.DeadLetter{}, err
	}
	if len(dls) == 0 {
		return sqladapters.DeadLetter{}, fmt.Errorf("%w: id %d", ErrNotFound, id)
	}
	return dls[0], nil
}

// CountDeadLetters counts the dead letters matching f: what Requeue or
// Discard with the same filter would change, for a dry run.
func (o *Ops) CountDeadLetters(ctx context.Context, f Filter) (int64, error) {
	return o.count(ctx, "count dead letters", o.d.CountDeadLetters(f.Where(time.Now())))
}

// ErrorGroup is the dead letters sharing one last error.
type ErrorGroup struct {
	// Error is the last error, "" when none was recorded.
	Error string
	// Count is the number of dead letters with this error.
	Count int64
	// SampleID is the lowest id among them, for ShowDeadLetter.
	SampleID int64
	// FirstDeadAge and LastDeadAge are how long ago the first and the
	// latest of them died.
	FirstDeadAge, LastDeadAge time.Duration
}

// GroupDeadLetters groups the dead letters matching f by last error, most
// rows first, at most limit groups (0 means DefaultListLimit).
func (o *Ops) GroupDeadLetters(ctx context.Context, f Filter, limit int) ([]ErrorGroup, error) {
	if limit == 0 {
		limit = DefaultListLimit
	}
	if limit < 1 || limit > MaxBatchSize {
		return nil, fmt.Errorf("%w: limit must be between 1 and %d, got %d", sqladapters.ErrInvalidConfig, MaxBatchSize, limit)
	}
	var out []ErrorGroup
	err := o.query(ctx, "group dead letters", o.d.GroupDeadLetters(f.Where(time.Now()), limit), func(r sqladapters.Rows) error {
		var g ErrorGroup
		var first, last sql.NullInt64
		if err := r.Scan(&g.Error, &g.Count, &g.SampleID, &first, &last); err != nil {
			return err
		}
		g.FirstDeadAge, g.LastDeadAge = micros(first), micros(last)
		out = append(out, g)
		return nil
	})
	return out, err
}

// ChangeOptions tunes Requeue and Discard.
type ChangeOptions struct {
	// BatchSize is the number of rows changed per statement. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// Progress, when set, is called after every batch with the rows
	// changed so far.
	Progress func(changed int64)
}

// Requeue makes the dead letters matching f pending again with zero
// attempts, batch by batch in id order, and returns how many it requeued.
// The zero Filter requeues every dead letter. Preview with
// CountDeadLetters.
func (o *Ops) Requeue(ctx context.Context, f Filter, opts ChangeOptions) (int64, error) {
	return o.change(ctx, "requeue dead letters", f, opts, o.d.RequeueDeadLetters)
}

// Discard deletes the dead letters matching f, batch by batch in id order,
// and returns how many it deleted. The zero Filter discards every dead
// letter. Preview with CountDeadLetters.
func (o *Ops) Discard(ctx context.Context, f Filter, opts ChangeOptions) (int64, error) {
	return o.change(ctx, "discard dead letters", f, opts, o.d.DeleteDeadLetters)
}

// change selects a batch of matching ids and applies stmt to them, until no
// id is left. Rows requeued or discarded by someone else in between are
// skipped by stmt, which only changes rows that are still dead.
func (o *Ops) change(ctx context.Context, op string, f Filter, opts ChangeOptions, stmt func([]int64) sqladapters.Query) (int64, error) {
	batch, err := batchSize(opts.BatchSize)
	if err != nil {
		return 0, err
	}
	w := f.Where(time.Now())
	var total, after int64
	for {
		ids, err := o.ids(ctx, op, o.d.SelectDeadLetterIDs(w, after, batch))
		if err != nil {
			return total, err
		}
		if len(ids) == 0 {
			return total, nil
		}
		n, err := stmt(ids).Exec(ctx, o.db)
		if err != nil {
			return total, o.fail(op, err)
		}
		total += n
		after = ids[len(ids)-1]
		if opts.Progress != nil {
			opts.Progress(total)
		}
		if len(ids) < batch {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, errors.Join(fmt.Errorf("millbox: %s: stopped after %d rows", op, total), err)
		}
	}
}
