package forwarder

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/internal/failure"
	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/sqladapters"
)

// deleteChunk bounds the ids of one delete statement.
const deleteChunk = 5000

// deleter removes published rows (or moves them to the kept rows' table,
// with KeepForwarded) in
// the background, in as few statements as the backlog allows, and reports
// each batch back once it is done with it.
type deleter struct {
	f    *Forwarder
	mu   sync.Mutex
	rows []*source.Row
	more chan struct{}   // signalled when rows grew
	quit chan struct{}   // closed by close: flush and stop
	stop <-chan struct{} // closed when the engine is gone
	done chan struct{}
	out  chan<- ackedBatch
}

// ackedBatch is a batch of rows the deleter is done with: done are gone
// from the outbox (or kept), left could not be removed and are pending
// again.
type ackedBatch struct {
	done, left []*source.Row
}

func newDeleter(f *Forwarder, out chan<- ackedBatch, stop <-chan struct{}) *deleter {
	d := &deleter{f: f, more: make(chan struct{}, 1), quit: make(chan struct{}), stop: stop, done: make(chan struct{}), out: out}
	go d.loop()
	return d
}

// add never blocks: the engine hands over rows and moves on.
func (d *deleter) add(rows []*source.Row) {
	d.mu.Lock()
	d.rows = append(d.rows, rows...)
	d.mu.Unlock()
	select {
	case d.more <- struct{}{}:
	default:
	}
}

// close flushes what was added and waits for the loop to end.
func (d *deleter) close() {
	close(d.quit)
	<-d.done
}

func (d *deleter) loop() {
	defer close(d.done)
	for {
		d.mu.Lock()
		rows := d.rows
		d.rows = nil
		d.mu.Unlock()
		if len(rows) > 0 {
			done, left := d.complete(rows)
			select {
			case d.out <- ackedBatch{done: done, left: left}:
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
func (d *deleter) complete(rows []*source.Row) (done, left []*source.Row) {
	f := d.f
	deadline := time.Now().Add(max(f.cfg.CloseTimeout, time.Second))
	var delay time.Duration
	for len(rows) > 0 {
		n := min(len(rows), deleteChunk)
		chunk := rows[:n]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		retry, err := f.completeChunk(ctx, chunk)
		cancel()
		if err == nil {
			retry = slices.DeleteFunc(retry, func(r *source.Row) bool {
				if time.Now().After(deadline) {
					left = append(left, r)
					return true
				}
				return false
			})
			done = append(done, slices.DeleteFunc(slices.Clone(chunk), func(r *source.Row) bool { return slices.Contains(retry, r) })...)
			rows = append(retry, rows[n:]...)
			if len(retry) > 0 {
				time.Sleep(10 * time.Millisecond)
			}
			delay = 0
			continue
		}
		f.reportError(err)
		if time.Now().After(deadline) {
			f.cfg.Logger.Error("millbox forwarder: cannot remove published rows; they will be published again", err,
				watermill.LogFields{"rows": len(chunk)})
			left = append(left, chunk...)
			rows = rows[n:]
			continue
		}
		f.cfg.Logger.Error("millbox forwarder: removing published rows failed; retrying", err, nil)
		delay = failure.RetryDelay(delay)
		time.Sleep(delay)
	}
	return done, left
}

// completeChunk removes one chunk and returns the rows it should try
// again: rows of a stream whose transaction was not visible yet.
func (f *Forwarder) completeChunk(ctx context.Context, rows []*source.Row) (retry []*source.Row, err error) {
	var plain, streamed []int64
	var emitted []sqladapters.WrittenMessage
	var emittedRows []*source.Row
	for _, r := range rows {
		switch {
		case r.Emitted:
			// In no table: nothing to delete, and with KeepForwarded
			// written into the kept rows, last, so that a retry of the
			// chunk does not write them twice.
			if f.cfg.KeepForwarded {
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
		if _, err := f.cfg.Dialect.CompleteForwarded(ctx, f.cfg.DB, plain, f.cfg.KeepForwarded); err != nil {
			return nil, err
		}
	}
	lg := f.cfg.Dialect.Logical()
	if len(streamed)+len(emitted) > 0 && lg == nil {
		return nil, errors.New("millbox: rows of a replication stream on a database without one")
	}
	if len(streamed) > 0 {
		found, xmin, err := lg.CompleteStreamed(ctx, f.cfg.DB, streamed, f.cfg.KeepForwarded)
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
		if _, err := lg.WriteMessages(ctx, f.cfg.DB, emitted); err != nil {
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

// completeNow removes rows, or stamps them with KeepForwarded. Rows of a
// stream whose transaction is not visible yet are tried again for up to
// visibleWait; a row not found by then is gone (its transaction id, seen
// a moment before its commit was visible, would have become visible
// within milliseconds).
func (f *Forwarder) completeNow(ctx context.Context, rows []*source.Row, visibleWait time.Duration) error {
	deadline := time.Now().Add(visibleWait)
	for len(rows) > 0 {
		n := min(len(rows), deleteChunk)
		retry, err := f.completeChunk(ctx, rows[:n])
		if err != nil {
			return err
		}
		if len(retry) > 0 && time.Now().After(deadline) {
			f.cfg.Logger.Info("millbox forwarder: published rows not found; taking them as removed",
				watermill.LogFields{"rows": len(retry), "first_id": retry[0].ID})
			retry = nil
		}
		rows = append(retry, rows[n:]...)
		if len(retry) > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return nil
}
