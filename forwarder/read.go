package forwarder

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// maxReadLimit bounds a read that over-reads to skip rows in flight.
const maxReadLimit = 50000

// readResult is the outcome of one read of the outbox.
type readResult struct {
	rows   []sqladapters.OutboxRow
	readAt time.Time // when the read started: row ages count from it
	full   bool      // the read hit its limit: more rows are likely due
	err    error
}

// read returns up to limit due rows of the owned partitions (nil: all),
// leaving out the ids in exclude where the dialect can
// (Features.ExcludeInSQL); elsewhere the caller raises limit instead and
// drops them.
//
// backlog applies a dialect's PendingReadSetup: only a read following a
// full one pays for the extra round trips of its transaction.
func (f *Forwarder) read(ctx context.Context, owned []int, exclude []int64, limit int, backlog bool) readResult {
	q := sqladapters.PendingQuery{Partitions: f.cfg.Partitions, Owned: owned, Limit: limit, Exclude: exclude}
	var on sqladapters.Executor = f.cfg.DB
	if setup, ok := f.cfg.Dialect.(sqladapters.PendingReadSetup); ok && backlog {
		tx, err := f.readTx(ctx, setup.PendingReadSetup())
		if err != nil {
			return readResult{err: fmt.Errorf("millbox: read outbox: %w", f.cfg.Dialect.ClassifyError(err))}
		}
		defer sqladapters.Rollback(tx)
		on = tx
	}
	sel := f.cfg.Dialect.SelectPending
	ages, withAge := f.cfg.Dialect.(sqladapters.PendingAges)
	if withAge {
		sel = ages.SelectPendingWithAge
	}
	readAt := time.Now()
	rows, err := sel(q).Query(ctx, on)
	if err != nil {
		return readResult{err: fmt.Errorf("millbox: read outbox: %w", f.cfg.Dialect.ClassifyError(err))}
	}
	defer rows.Close()
	out := make([]sqladapters.OutboxRow, 0, min(limit, 4096))
	// One set of scan targets for all rows: a fresh one per row would
	// put every row on the heap twice.
	var (
		r      sqladapters.OutboxRow
		key    sql.NullString
		micros sql.NullInt64
	)
	dest := []any{&r.ID, &r.Topic, &r.UUID, &r.Payload, &r.Metadata, &key, &r.Attempts, &micros}
	if !withAge {
		dest = dest[:7]
	}
	for rows.Next() {
		r, key, micros = sqladapters.OutboxRow{}, sql.NullString{}, sql.NullInt64{}
		if err := rows.Scan(dest...); err != nil {
			return readResult{err: fmt.Errorf("millbox: read outbox row: %w", err)}
		}
		r.Key = key.String
		r.Age = time.Duration(micros.Int64) * time.Microsecond
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return readResult{err: fmt.Errorf("millbox: read outbox: %w", f.cfg.Dialect.ClassifyError(err))}
	}
	return readResult{rows: out, readAt: readAt, full: len(out) >= limit}
}

// readTx begins the read-only transaction a dialect's pending read runs
// in and applies its settings.
func (f *Forwarder) readTx(ctx context.Context, setup []sqladapters.Query) (sqladapters.Tx, error) {
	tx, err := f.cfg.DB.Begin(ctx, sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	for _, q := range setup {
		if _, err := q.Exec(ctx, tx); err != nil {
			sqladapters.Rollback(tx)
			return nil, err
		}
	}
	return tx, nil
}
