package completer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/internal/retry"
	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/sqladapters"
)

// deleteChunk bounds the ids of one delete statement.
const deleteChunk = 5000

// Config is what a Completer needs.
type Config struct {
	DB      sqladapters.DB
	Dialect sqladapters.Dialect
	// KeepForwarded moves rows to the kept rows' table instead of
	// deleting them.
	KeepForwarded bool
	// CloseTimeout bounds how long rows are retried before they are given
	// up (left pending, to be published again).
	CloseTimeout time.Duration
	Logger       watermill.LoggerAdapter
	// ReportError reports an error the completer retries.
	ReportError func(error)
}

// Completer removes published rows in the background.
type Completer struct {
	cfg  Config
	mu   sync.Mutex
	rows []*source.Row
	more chan struct{}   // signalled when rows grew
	quit chan struct{}   // closed by close: flush and stop
	stop <-chan struct{} // closed when the engine is gone
	done chan struct{}
	out  chan<- Batch
}

// Batch is a batch of rows the completer is done with: Done are gone
// from the outbox (or kept), Left could not be removed and are pending
// again.
type Batch struct {
	Done, Left []*source.Row
}

// Start returns a completer that reports to out until stop is closed, and
// starts its goroutine.
func Start(cfg Config, out chan<- Batch, stop <-chan struct{}) *Completer {
	d := &Completer{cfg: cfg, more: make(chan struct{}, 1), quit: make(chan struct{}), stop: stop, done: make(chan struct{}), out: out}
	go d.loop()
	return d
}

// Add hands over rows to remove; it never blocks.
func (d *Completer) Add(rows []*source.Row) {
	d.mu.Lock()
	d.rows = append(d.rows, rows...)
	d.mu.Unlock()
	select {
	case d.more <- struct{}{}:
	default:
	}
}

// Close removes what was added and waits for the goroutine to end.
func (d *Completer) Close() {
	close(d.quit)
	<-d.done
}

func (d *Completer) loop() {
	defer close(d.done)
	for {
		d.mu.Lock()
		rows := d.rows
		d.rows = nil
		d.mu.Unlock()
		if len(rows) > 0 {
			done, left := d.complete(rows)
			select {
			case d.out <- Batch{Done: done, Left: left}:
			case <-d.stop: // the engine is gone
			}
			continue
		}
		select {
		case <-d.more:
		case <-d.quit:
			d.mu.Lock()
			empty := len(d.rows) == 0
			d.mu.Unlock()
			if empty {
				return
			}
		}
	}
}

// complete retries until the rows are gone or CloseTimeout passed; rows it
// cannot delete stay in the outbox and are published again later (at
// least once): it returns them as left. Rows seen in a replication stream
// may not be visible yet: a statement that does not find them tries again
// until their transaction is visible to it.
func (d *Completer) complete(rows []*source.Row) (done, left []*source.Row) {
	deadline := time.Now().Add(max(d.cfg.CloseTimeout, time.Second))
	backoff := retry.Backoff{Policy: retry.Operations}
	for len(rows) > 0 {
		n := min(len(rows), deleteChunk)
		chunk := rows[:n]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		again, err := d.completeChunk(ctx, chunk)
		cancel()
		if err == nil {
			again = slices.DeleteFunc(again, func(r *source.Row) bool {
				if time.Now().After(deadline) {
					left = append(left, r)
					return true
				}
				return false
			})
			done = append(done, slices.DeleteFunc(slices.Clone(chunk), func(r *source.Row) bool { return slices.Contains(again, r) })...)
			rows = append(again, rows[n:]...)
			if len(again) > 0 {
				time.Sleep(10 * time.Millisecond)
			}
			backoff.Reset()
			continue
		}
		d.cfg.ReportError(err)
		if time.Now().After(deadline) {
			d.cfg.Logger.Error("millbox forwarder: cannot remove published rows; they will be published again", err,
				watermill.LogFields{"rows": len(chunk)})
			left = append(left, chunk...)
			rows = rows[n:]
			continue
		}
		d.cfg.Logger.Error("millbox forwarder: removing published rows failed; retrying", err, nil)
		time.Sleep(backoff.Next(err))
	}
	return done, left
}

// completeChunk removes one chunk and returns the rows it should try
// again: rows of a stream whose transaction was not visible yet.
func (d *Completer) completeChunk(ctx context.Context, rows []*source.Row) (retry []*source.Row, err error) {
	var plain, streamed []int64
	var emitted []sqladapters.WrittenMessage
	var emittedRows []*source.Row
	for _, r := range rows {
		switch {
		case r.Emitted:
			// In no table: nothing to delete, and with KeepForwarded
			// written into the kept rows, last, so that a retry of the
			// chunk does not write them twice.
			if d.cfg.KeepForwarded {
				emitted = append(emitted, writtenOf(r, true))
				emittedRows = append(emittedRows, r)
			}
		case r.XID != 0:
			streamed = append(streamed, r.ID)
		default:
			plain = append(plain, r.ID)
		}
	}
	if len(plain) > 0 {
		if _, err := d.cfg.Dialect.CompleteForwarded(ctx, d.cfg.DB, plain, d.cfg.KeepForwarded); err != nil {
			return nil, err
		}
	}
	lg := d.cfg.Dialect.Logical()
	if len(streamed)+len(emitted) > 0 && lg == nil {
		return nil, errors.New("millbox: rows of a replication stream on a database without one")
	}
	if len(streamed) > 0 {
		found, xmin, err := lg.CompleteStreamed(ctx, d.cfg.DB, streamed, d.cfg.KeepForwarded)
		if err != nil {
			return nil, err
		}
		if len(found) < len(streamed) {
			seen := make(map[int64]struct{}, len(found))
			for _, id := range found {
				seen[id] = struct{}{}
			}
			for _, r := range rows {
				if _, ok := seen[r.ID]; !ok && !r.Emitted && r.XID != 0 && !precedes(r.XID, uint32(xmin)) {
					// Not visible to the statement yet: its transaction
					// may still be ending. A row whose transaction had
					// ended is gone.
					retry = append(retry, r)
				}
			}
		}
	}
	switch {
	case len(emitted) == 0:
	case len(retry) > 0:
		retry = append(retry, emittedRows...) // written with the retry
	default:
		if _, err := lg.WriteMessages(ctx, d.cfg.DB, emitted); err != nil {
			return nil, err
		}
	}
	return retry, nil
}

// writtenOf is the emitted row r as Logical.WriteMessages writes it.
func writtenOf(r *source.Row, kept bool) sqladapters.WrittenMessage {
	return sqladapters.WrittenMessage{
		OutboxMessage: sqladapters.OutboxMessage{
			Topic: r.Topic, UUID: r.UUID, Payload: r.Payload, Metadata: r.Metadata, Key: r.Key, KeyHash: r.KeyHash,
		},
		ID:      r.ID,
		Created: r.Created,
		Kept:    kept,
	}
}

// precedes compares 32-bit transaction ids modulo wraparound.
func precedes(a, b uint32) bool { return int32(a-b) < 0 }

// Now removes rows, or stamps them with KeepForwarded, and returns when
// it is done. Rows of a
// stream whose transaction is not visible yet are tried again for up to
// visibleWait; a row not found by then is gone (its transaction id, seen
// a moment before its commit was visible, would have become visible
// within milliseconds).
func (d *Completer) Now(ctx context.Context, rows []*source.Row, visibleWait time.Duration) error {
	deadline := time.Now().Add(visibleWait)
	for len(rows) > 0 {
		n := min(len(rows), deleteChunk)
		again, err := d.completeChunk(ctx, rows[:n])
		if err != nil {
			return err
		}
		if len(again) > 0 && time.Now().After(deadline) {
			d.cfg.Logger.Info("millbox forwarder: published rows not found; taking them as removed",
				watermill.LogFields{"rows": len(again), "first_id": again[0].ID})
			again = nil
		}
		rows = append(again, rows[n:]...)
		if len(again) > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return nil
}
