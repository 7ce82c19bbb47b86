package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/millbox/millbox/sqladapters"
)

// ListQuery is one page of ListDeadLetters: the dead letters its Filter
// selects after AfterID, at most Limit (0 means DefaultListLimit), without
// payloads and metadata unless Payloads is set.
type ListQuery = sqladapters.DeadLetterQuery

// ErrorGroup is the dead letters sharing one last error.
type ErrorGroup = sqladapters.ErrorGroup

// ListDeadLetters returns the page q of dead letters, in id order. Page
// through them by passing the last id seen as q.AfterID.
func (o *Ops) ListDeadLetters(ctx context.Context, q ListQuery) ([]sqladapters.DeadLetter, error) {
	var err error
	if q.Limit, err = limitOf(q.Limit); err != nil {
		return nil, err
	}
	dls, err := o.d.ListDeadLetters(ctx, o.db, q)
	return dls, fail("list dead letters", err)
}

// ShowDeadLetter returns the dead letter with the given id, payload and
// metadata included, or ErrNotFound.
func (o *Ops) ShowDeadLetter(ctx context.Context, id int64) (sqladapters.DeadLetter, error) {
	dls, err := o.d.ListDeadLetters(ctx, o.db, ListQuery{Filter: Filter{IDs: []int64{id}}, Limit: 1, Payloads: true})
	if err != nil {
		return sqladapters.DeadLetter{}, fail("show dead letter", err)
	}
	if len(dls) == 0 {
		return sqladapters.DeadLetter{}, fmt.Errorf("%w: id %d", ErrNotFound, id)
	}
	return dls[0], nil
}

// CountDeadLetters counts the dead letters f selects: what Requeue or
// Discard with the same filter would change, for a dry run.
func (o *Ops) CountDeadLetters(ctx context.Context, f Filter) (int64, error) {
	n, err := o.d.CountDeadLetters(ctx, o.db, f)
	return n, fail("count dead letters", err)
}

// GroupDeadLetters groups the dead letters f selects by last error, most
// rows first, at most limit groups (0 means DefaultListLimit).
func (o *Ops) GroupDeadLetters(ctx context.Context, f Filter, limit int) ([]ErrorGroup, error) {
	limit, err := limitOf(limit)
	if err != nil {
		return nil, err
	}
	gs, err := o.d.GroupDeadLetters(ctx, o.db, f, limit)
	return gs, fail("group dead letters", err)
}

// HeldKey is an ordering key held by a dead letter.
type HeldKey = sqladapters.HeldKey

// HeldKeys lists the keys held by dead letters (see
// forwarder.Config.DeadLetterHoldsKey), at most limit (0 means
// DefaultListLimit), in the order of their dead letters' ids, each with
// the number of messages waiting behind it. Requeue the dead letter to
// send it and then them, in order, or Discard it to let them go on. It
// reads the outbox once.
func (o *Ops) HeldKeys(ctx context.Context, limit int) ([]HeldKey, error) {
	limit, err := limitOf(limit)
	if err != nil {
		return nil, err
	}
	ks, err := o.d.HeldKeys(ctx, o.db, limit)
	return ks, fail("list held keys", err)
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

// Requeue moves the dead letters f selects back into the outbox, under
// their ids, pending with zero attempts, batch by batch in id order, and
// returns how many it requeued.
// Filter{All: true} requeues every dead letter; a filter that selects
// every dead letter without All is refused (ErrEverything). Preview with
// CountDeadLetters. A requeued row goes out as soon as a forwarder reads
// it: rows of its key published while it was dead have gone ahead of it,
// unless it held its key (forwarder.Config.DeadLetterHoldsKey): then it
// goes first, and the key's messages held behind it follow in order.
// The outbox records when it was requeued, and its pending age counts
// from then (Status, the admin page, the outbox metrics); its created
// time stays the message's.
func (o *Ops) Requeue(ctx context.Context, f Filter, opts ChangeOptions) (int64, error) {
	return o.change(ctx, "requeue dead letters", f, opts, o.d.RequeueDeadLetters)
}

// Discard deletes the dead letters f selects, batch by batch in id order,
// and returns how many it deleted. Filter{All: true} discards every dead
// letter; a filter that selects every dead letter without All is refused
// (ErrEverything). Preview with CountDeadLetters. A key a discarded dead letter
// held goes on with its next message.
func (o *Ops) Discard(ctx context.Context, f Filter, opts ChangeOptions) (int64, error) {
	return o.change(ctx, "discard dead letters", f, opts, o.d.DiscardDeadLetters)
}

// change selects a batch of matching ids and applies apply to them, until
// no id is left. Rows requeued or discarded by someone else in between are
// skipped by apply, which only changes rows that are still dead letters.
func (o *Ops) change(ctx context.Context, op string, f Filter, opts ChangeOptions,
	apply func(context.Context, sqladapters.Executor, []int64) (int64, error)) (int64, error) {
	switch verb := strings.Fields(op)[0]; {
	case f.All && !f.IsZero():
		return 0, fail(op, fmt.Errorf("%w: Filter.All selects every dead letter and takes no other field; leave it out to %s only the dead letters the other fields select", sqladapters.ErrInvalidConfig, verb))
	case !f.All && f.IsZero():
		return 0, fail(op, fmt.Errorf("%w (it sets no ids, topic, key, error text, error group or age): set Filter.All to %s them all", ErrEverything, verb))
	}
	batch, err := batchSize(opts.BatchSize)
	if err != nil {
		return 0, err
	}
	var total, after int64
	for {
		ids, err := o.d.DeadLetterIDs(ctx, o.db, f, after, batch)
		if err != nil {
			return total, fail(op, err)
		}
		if len(ids) == 0 {
			return total, nil
		}
		n, err := apply(ctx, o.db, ids)
		if err != nil {
			return total, fail(op, err)
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
