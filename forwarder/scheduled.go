package forwarder

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/sqladapters"
)

// mover moves scheduled messages into the outbox once they are due
// (sqladapters.Dialect.MoveDue). Every instance runs one, whatever its
// source and partitions: concurrent moves never move a message twice, and
// the rows a move writes are ordinary outbox inserts, which reach the
// instance owning them as any insert does (a read of the polling source,
// woken in this process and by a notification where the dialect notifies;
// the replication stream of cdc.Source).
type mover struct {
	f   *Forwarder
	sub *dueSub
	// next is when the mover looks next; it looks at least once per
	// PollInterval, and at the earliest due time it knows of.
	next time.Time
	// awaited is the earliest due time a publisher of this process
	// reported and no move has answered yet. The publisher reports before
	// its transaction commits, so when that time comes and the move finds
	// nothing, the mover looks again after retry, doubling up to
	// awaitRetryMax (the transaction may also have rolled back).
	awaited time.Time
	retry   time.Duration
	lastErr time.Time // when an error was last logged
}

// awaitRetryMin and awaitRetryMax bound the looks again after a due time
// a publisher of this process reported.
const (
	awaitRetryMin = 20 * time.Millisecond
	awaitRetryMax = 2 * time.Second
)

// newMover subscribes to the due times this process's publishers write.
func newMover(f *Forwarder) (*mover, func()) {
	sub, unsubscribe := subscribeDue(f.cfg.Dialect.OutboxTable())
	return &mover{f: f, sub: sub}, unsubscribe
}

// run looks at once and then until ctx ends.
func (m *mover) run(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.sub.ch:
			if t := m.sub.take(); !t.IsZero() {
				m.await(t)
				if t.Before(m.next) {
					m.next = t
					timer.Reset(time.Until(t))
				}
			}
			continue
		case <-timer.C:
		}
		moved, next, err := m.move(ctx)
		if err != nil && ctx.Err() == nil {
			m.logError(err)
		}
		wait := m.f.cfg.PollInterval
		if !next.IsZero() {
			wait = min(wait, time.Until(next))
		}
		if !m.awaited.IsZero() && !time.Now().Before(m.awaited) {
			if moved > 0 || m.retry >= awaitRetryMax {
				m.awaited, m.retry = time.Time{}, 0
			} else {
				m.retry = max(2*m.retry, awaitRetryMin)
				wait = min(wait, m.retry)
			}
		}
		// A due time reported while the move ran may come before it.
		if t := m.sub.take(); !t.IsZero() {
			m.await(t)
			wait = min(wait, time.Until(t))
		}
		wait = max(wait, 0)
		m.next = time.Now().Add(wait)
		timer.Reset(wait)
	}
}

// await notes a due time a publisher of this process reported.
func (m *mover) await(t time.Time) {
	if m.awaited.IsZero() || t.Before(m.awaited) {
		m.awaited, m.retry = t, 0
	}
}

// move moves every message due now, a batch at a time, and returns how
// many it moved and the earliest due time still scheduled (zero when none
// is).
func (m *mover) move(ctx context.Context) (int64, time.Time, error) {
	var total int64
	defer func() {
		if total > 0 {
			wake(m.f.cfg.Dialect.OutboxTable())
			m.notify(ctx)
		}
	}()
	for {
		n, next, err := m.f.cfg.Dialect.MoveDue(ctx, m.f.cfg.DB, time.Now(), m.f.cfg.BatchSize)
		total += n
		if err != nil || n < int64(m.f.cfg.BatchSize) || ctx.Err() != nil {
			return total, next, err
		}
	}
}

// notify wakes the forwarders of other processes where the outbox insert
// notifies: the move's rows did not.
func (m *mover) notify(ctx context.Context) {
	if m.f.cfg.Dialect.NotifyChannel() == "" {
		return
	}
	if err := m.f.cfg.Dialect.NotifyProbe(ctx, m.f.cfg.DB); err != nil && ctx.Err() == nil {
		m.logError(err)
	}
}

// logError logs err at most every ten seconds and reports it.
func (m *mover) logError(err error) {
	m.f.reportError(err)
	if time.Since(m.lastErr) < 10*time.Second {
		return
	}
	m.lastErr = time.Now()
	m.f.cfg.Logger.Error("millbox forwarder: cannot move due scheduled messages into the outbox", err,
		watermill.LogFields{"table": m.f.cfg.Dialect.OutboxTable()})
}

// checkScheduled fails when the table of scheduled messages is missing,
// so that Run refuses to start on a schema without it rather than leaving
// scheduled messages where nothing moves them.
func (f *Forwarder) checkScheduled(ctx context.Context) error {
	_, _, err := f.cfg.Dialect.MoveDue(ctx, f.cfg.DB, time.Time{}, 1)
	if errors.Is(err, sqladapters.ErrMissingTable) {
		return err
	}
	return nil
}
